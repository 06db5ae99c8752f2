package proxytest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TCPTarget is a TCP server on 127.0.0.1 that runs a handler for each
// connection: the endpoint a tunnel reaches.
type TCPTarget struct {
	l      net.Listener
	handle func(net.Conn)

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup // the accept loop and the handlers
}

// StartTCPTarget listens on a random loopback port and runs handle in its
// own goroutine for each connection; the connection is closed when handle
// returns. Close, registered with tb.Cleanup, closes the listener and every
// connection and waits for the handlers.
func StartTCPTarget(tb testing.TB, handle func(net.Conn)) *TCPTarget {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err, "listen for the target")
	t := &TCPTarget{l: l, handle: handle, conns: map[net.Conn]struct{}{}}
	t.wg.Add(1)
	go t.serve()
	tb.Cleanup(t.Close)
	return t
}

// Addr is the target's host:port.
func (t *TCPTarget) Addr() string { return t.l.Addr().String() }

// Close stops the target and waits for its handlers. It may be called more
// than once.
func (t *TCPTarget) Close() {
	_ = t.l.Close() // a second Close reports net.ErrClosed: fine
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

func (t *TCPTarget) serve() {
	defer t.wg.Done()
	for {
		c, err := t.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			defer func() {
				c.Close()
				t.mu.Lock()
				delete(t.conns, c)
				t.mu.Unlock()
			}()
			t.handle(c)
		}()
	}
}

// Echo is a TCPTarget handler that writes back what it reads until EOF.
func Echo(c net.Conn) { _, _ = io.Copy(c, c) }

// Bulk is a TCPTarget handler for throughput measurements. It reads
// requests of one command byte and an 8-byte big-endian length n:
//
//   - 'U' (upload): it reads n bytes, then writes one byte 'k';
//   - 'D' (download): it writes n bytes.
//
// It serves requests until EOF or an unknown command.
func Bulk(c net.Conn) {
	buf := make([]byte, 32<<10)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int64(binary.BigEndian.Uint64(hdr[1:]))
		switch hdr[0] {
		case 'U':
			if err := discard(c, n, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{'k'}); err != nil {
				return
			}
		case 'D':
			for n > 0 {
				m := min(n, int64(len(buf)))
				if _, err := c.Write(buf[:m]); err != nil {
					return
				}
				n -= m
			}
		default:
			return
		}
	}
}

// Upload sends len(data) bytes to a [Bulk] target over c in chunks of at
// most chunk bytes, and waits for the target to confirm it read them all.
func Upload(c net.Conn, data []byte, chunk int) error {
	var hdr [9]byte
	hdr[0] = 'U'
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(data)))
	if _, err := c.Write(hdr[:]); err != nil {
		return fmt.Errorf("send upload request: %w", err)
	}
	for len(data) > 0 {
		m := min(len(data), chunk)
		if _, err := c.Write(data[:m]); err != nil {
			return fmt.Errorf("upload: %w", err)
		}
		data = data[m:]
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("read upload confirmation: %w", err)
	}
	if ack[0] != 'k' {
		return fmt.Errorf("upload confirmation is %q, want 'k'", ack[0])
	}
	return nil
}

// Download asks a [Bulk] target over c for n bytes and reads them into
// buf-sized pieces.
func Download(c net.Conn, n int64, buf []byte) error {
	var hdr [9]byte
	hdr[0] = 'D'
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return fmt.Errorf("send download request: %w", err)
	}
	if err := discard(c, n, buf); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	return nil
}

// discard reads exactly n bytes from r into buf, over and over. (io.Copy to
// io.Discard would read 8 KiB at a time whatever buffer it is given.)
func discard(r io.Reader, n int64, buf []byte) error {
	for n > 0 {
		m, err := r.Read(buf[:min(n, int64(len(buf)))])
		n -= int64(m)
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				return fmt.Errorf("%d bytes short: %w", n, io.ErrUnexpectedEOF)
			}
			if n > 0 {
				return err
			}
		}
	}
	return nil
}
