// Package logtest captures klog output in tests, so that a test can check
// what an operator would read at a given -v level.
package logtest

import (
	"bytes"
	"sync"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// Buffer collects log output. It is safe for the concurrent writes of a
// logger shared by goroutines.
type Buffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NewLogger returns a logger that writes what verbosity v lets through,
// in klog's text format, to a new Buffer.
func NewLogger(v int) (klog.Logger, *Buffer) {
	b := &Buffer{}
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(b), textlogger.Verbosity(v))), b
}
