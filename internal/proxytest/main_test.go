//go:debug netdns=go

// The directive above pins the pure Go resolver, which rejects a malformed
// name (a label over 63 bytes, a space) without sending a query (cgo's
// getaddrinfo might not): these tests must never send a packet off
// loopback.

package proxytest

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/logtest"
)

// logs receives klog's output for the whole test binary; tests capture
// it with logs.Capture.
var logs = logtest.KlogTee(os.Stderr)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
