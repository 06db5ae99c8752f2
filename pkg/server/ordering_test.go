package server_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// In HTTP CONNECT mode the 200 line reaches the client
// before any byte of the target's, even when the target speaks first and
// its bytes reach the server before the 200 is written. The test makes
// that ordering certain: the client connection holds the server's write
// of the 200 until the target's greeting is queued for the client (or
// until something else is written on the connection, as the writer did
// before the fix).
func TestHTTPConnectAnswersBeforeTheTargetSpeaks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	queued := gaugeOf(reg, "servercount_server_queued_bytes", nil)

	lis := &holdingListener{Listener: listen(t), release: make(chan struct{})}
	hs := &http.Server{Handler: e.srv.HTTPConnect(), ReadHeaderTimeout: waitFor}
	served := make(chan struct{})
	go func() { defer close(served); _ = hs.Serve(lis) }()
	t.Cleanup(func() { _ = hs.Close(); <-served })

	a, err := connectAgent(t, e, agentOpts{id: "greeter"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	greeting := []byte("SSH-2.0-greeting\r\n")
	go func() {
		// The target speaks as soon as it is dialled.
		if _, err := a.AcceptDial(1); err == nil {
			_ = a.Send(wire.Data(1, greeting))
		}
	}()

	c, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "CONNECT 10.0.0.1:22 HTTP/1.1\r\nHost: 10.0.0.1:22\r\n\r\n")
	require.NoError(t, err)
	go func() {
		// Let the 200 go once the greeting is queued for the client, or
		// once the writer has written something ahead of the 200.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for queued() < float64(len(greeting)) && !lis.early.Load() {
			select {
			case <-t.Context().Done():
				return
			case <-tick.C:
			}
		}
		close(lis.release)
	}()

	br := bufio.NewReader(c)
	first, err := br.Peek(len("HTTP/1.1 200"))
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 200", string(first), "the client read the target's bytes before the proxy's answer")
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, rsp.StatusCode)
	got := make([]byte, len(greeting))
	_, err = io.ReadFull(br, got)
	require.NoError(t, err)
	assert.Equal(t, greeting, got)
}

// holdingListener hands out connections whose write of a 200 answer
// waits for release; early records a write made while one waited.
type holdingListener struct {
	net.Listener
	release chan struct{}
	early   atomic.Bool
}

func (l *holdingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &holdingConn{Conn: c, l: l}, nil
}

type holdingConn struct {
	net.Conn
	l       *holdingListener
	mu      sync.Mutex
	holding bool
}

func (c *holdingConn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("HTTP/1.1 200")) {
		c.mu.Lock()
		c.holding = true
		c.mu.Unlock()
		<-c.l.release
		c.mu.Lock()
		c.holding = false
		c.mu.Unlock()
	} else if !strings.HasPrefix(string(p), "HTTP/") {
		c.mu.Lock()
		if c.holding {
			c.l.early.Store(true)
		}
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}
