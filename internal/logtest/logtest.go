// Package logtest captures log and process output in tests, so that a
// test can check what an operator would read at a given -v level.
package logtest

import (
	"bytes"
	"io"
	"sync"
	"testing"

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

// Tee passes what it is written to an io.Writer and copies it to every
// Buffer a running test captured from it. klog.SetLogger may only be
// called before anything logs, so a test binary sets a Tee as klog's output
// once, in TestMain, and each test captures klog's output through it
// instead of swapping the logger.
type Tee struct {
	out io.Writer

	mu       sync.Mutex // guards captures
	captures map[*Buffer]struct{}
}

// NewTee returns a Tee that passes everything on to out.
func NewTee(out io.Writer) *Tee {
	return &Tee{out: out, captures: map[*Buffer]struct{}{}}
}

// KlogTee returns a Tee passing on to out, set as klog's output for the
// whole test binary. Call it once, before anything logs: in TestMain or a
// package-level variable's initialiser.
func KlogTee(out io.Writer) *Tee {
	t := NewTee(out)
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(t))))
	return t
}

// Write copies p to every capture, then writes it to the Tee's writer.
func (t *Tee) Write(p []byte) (int, error) {
	t.mu.Lock()
	for b := range t.captures {
		_, _ = b.Write(p) // a Buffer's write does not fail
	}
	t.mu.Unlock()
	return t.out.Write(p)
}

// Capture returns a Buffer that receives what the Tee is written until
// tb ends.
func (t *Tee) Capture(tb testing.TB) *Buffer {
	b := &Buffer{}
	t.mu.Lock()
	t.captures[b] = struct{}{}
	t.mu.Unlock()
	tb.Cleanup(func() {
		t.mu.Lock()
		delete(t.captures, b)
		t.mu.Unlock()
	})
	return b
}
