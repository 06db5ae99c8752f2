package serve_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/serve"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// dialHTTP serves "ok" on a loopback port with lim until the test ends,
// and returns a raw connection to it on which any read or write past
// waitFor fails.
func dialHTTP(t *testing.T, lim serve.HTTPLimits) net.Conn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := serve.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), lim)
	// Close does not wait for the connections' goroutines (one that sent
	// 431 lingers to avoid a reset): wait until each is closed.
	var wg sync.WaitGroup
	srv.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			wg.Add(1)
		case http.StateClosed, http.StateHijacked:
			wg.Done()
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close(); wg.Wait() })

	c, err := net.DialTimeout("tcp", lis.Addr().String(), waitFor)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	return c
}

// Every HTTP server the binaries run has an idle
// timeout, a header timeout and a header size limit.
func TestNewHTTPServerDefaults(t *testing.T) {
	t.Parallel()
	srv := serve.NewHTTPServer(http.NotFoundHandler(), serve.HTTPLimits{})
	assert.Equal(t, serve.DefaultHTTPReadHeaderTimeout, srv.ReadHeaderTimeout)
	assert.Equal(t, serve.DefaultHTTPIdleTimeout, srv.IdleTimeout)
	assert.Equal(t, serve.DefaultHTTPMaxHeaderBytes, srv.MaxHeaderBytes)
}

// An idle keep-alive connection is closed by the server
// once IdleTimeout passes (a short one here, so that the test does not
// wait for the default).
func TestHTTPIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	c := dialHTTP(t, serve.HTTPLimits{IdleTimeout: 50 * time.Millisecond})
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// The connection stays open for keep-alive; the server must end it.
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "want the server to close the idle connection before the %v deadline", waitFor)
}

// A client that never finishes its headers is cut off
// after ReadHeaderTimeout.
func TestHTTPSlowHeadersAreCut(t *testing.T) {
	t.Parallel()
	c := dialHTTP(t, serve.HTTPLimits{ReadHeaderTimeout: 50 * time.Millisecond})
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	_, err := io.Copy(io.Discard, c)
	assert.NoError(t, err, "want the server to close the connection before the %v deadline", waitFor)
}

// Headers beyond MaxHeaderBytes are refused with 431.
func TestHTTPLargeHeadersAreRefused(t *testing.T) {
	t.Parallel()
	c := dialHTTP(t, serve.HTTPLimits{})
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 2*serve.DefaultHTTPMaxHeaderBytes))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// The connections each HTTP server of a Group holds, idle keep-alive ones
// included, are counted by server.
func TestGroupCountsHTTPConnections(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	conns := serve.NewHTTPConnectionsGauge("test", "group")
	require.NoError(t, reg.Register(conns))
	open := func() float64 {
		v, _ := metricstest.Value(reg, "test_group_http_open_connections", "server", "health")
		return v
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := serve.NewGroup()
	g.CountHTTPConnections(conns)
	g.HTTP("health server", lis, http.NotFoundHandler())
	ctx, cancel := context.WithCancel(t.Context())
	waitDone := make(chan error, 1)
	go func() { waitDone <- g.Wait(ctx, waitFor) }()
	defer func() {
		cancel()
		assert.NoError(t, <-waitDone)
	}()

	c, err := net.DialTimeout("tcp", lis.Addr().String(), waitFor)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return open() == 1 }, waitFor, 5*time.Millisecond, "the idle connection is not counted")
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return open() == 0 }, waitFor, 5*time.Millisecond, "the closed connection is still counted")
}
