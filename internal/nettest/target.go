package nettest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Target is a TCP server on 127.0.0.1 that runs a handler for each
// connection: the endpoint a tunnel reaches, or any peer a test needs.
type Target struct {
	l      net.Listener
	handle func(net.Conn)

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup // the accept loop and the handlers
}

// StartTarget listens on a random loopback port and runs handle in its own
// goroutine for each connection; the connection is closed when handle
// returns. Close, registered with tb.Cleanup, closes the listener and every
// connection and waits for the handlers.
func StartTarget(tb testing.TB, handle func(net.Conn)) *Target {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err, "listen for the target")
	t := &Target{l: l, handle: handle, conns: map[net.Conn]struct{}{}}
	t.wg.Go(t.serve)
	tb.Cleanup(t.Close)
	return t
}

// Serve is [StartTarget] for a test that needs only the address.
func Serve(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	return StartTarget(tb, handle).Addr()
}

// Echo runs a target that writes back what it reads on every connection,
// until the test ends, and returns its address.
func Echo(tb testing.TB) string {
	tb.Helper()
	return Serve(tb, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// Addr is the target's host:port.
func (t *Target) Addr() string { return t.l.Addr().String() }

// Close stops the target and waits for its handlers. It may be called more
// than once.
func (t *Target) Close() {
	_ = t.l.Close() // a second Close reports net.ErrClosed: fine
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

func (t *Target) serve() {
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
			_ = c.Close()
			return
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			defer func() {
				_ = c.Close()
				t.mu.Lock()
				delete(t.conns, c)
				t.mu.Unlock()
			}()
			t.handle(c)
		}()
	}
}

// Hold runs a target that accepts connections and holds them open,
// unread, until the test ends, with no goroutine, buffer or pipe per
// connection (an echo's copy splices through a pipe: two more files): the
// idle endpoints of thousands of tunnels in one process. It returns the
// target's address.
func Hold(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err, "listen for the target")
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}
