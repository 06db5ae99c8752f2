//go:debug netdns=go

// The directive above pins the pure Go resolver, which rejects a malformed
// name (a label over 63 bytes, a space) without sending a query (cgo's
// getaddrinfo might not): these tests must never send a packet off
// loopback.

package proxytest

import (
	"io"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/servercount/servercount/internal/logtest"
)

// logs receives klog's output for the whole test binary: klog.SetLogger
// may only be called before anything logs, so tests capture logs through
// it instead of swapping klog's logger.
var logs = &logTee{out: os.Stderr, captures: map[*logtest.Buffer]struct{}{}}

func TestMain(m *testing.M) {
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logs))))
	goleak.VerifyTestMain(m)
}

// logTee writes to out and to every capture buffer.
type logTee struct {
	out io.Writer

	mu       sync.Mutex // guards captures
	captures map[*logtest.Buffer]struct{}
}

func (l *logTee) Write(p []byte) (int, error) {
	l.mu.Lock()
	for b := range l.captures {
		_, _ = b.Write(p) // a bytes.Buffer write does not fail
	}
	l.mu.Unlock()
	return l.out.Write(p)
}

// capture returns a buffer that receives klog's output until the test
// ends.
func (l *logTee) capture(t testing.TB) *logtest.Buffer {
	b := &logtest.Buffer{}
	l.mu.Lock()
	l.captures[b] = struct{}{}
	l.mu.Unlock()
	t.Cleanup(func() {
		l.mu.Lock()
		delete(l.captures, b)
		l.mu.Unlock()
	})
	return b
}
