package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversary"
	"github.com/servercount/servercount/pkg/server"
)

// slowFrontendTimeout is the FrontendWriteTimeout of these tests: long
// enough that a frontend that reads is never taken for a deaf one on a
// loaded machine, short enough for a test.
const slowFrontendTimeout = 2 * time.Second

// endlessWriter starts a TCP server that writes to every connection until
// the write fails, and sends on ended when it has given up on one: the
// tunnel to it was closed.
func endlessWriter(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	done := make(chan struct{}, 16)
	addr = serveConns(t, func(c net.Conn) {
		chunk := make([]byte, 32<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				done <- struct{}{}
				return
			}
		}
	})
	return addr, done
}

// echoOnce writes a line through c and reads it back.
func echoOnce(c net.Conn, r io.Reader, n int) error {
	msg := []byte(fmt.Sprintf("ping %d\n", n))
	if err := c.SetDeadline(time.Now().Add(waitFor)); err != nil {
		return err
	}
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// gaugeOf reads a gauge from reg, 0 when the series does not exist.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) func() float64 {
	return func() float64 { return metricValue(t, reg, name, labels) }
}

// A gRPC frontend that opens a tunnel and never reads costs only its own
// tunnel (issue 10, item 7, the gRPC side): another tunnel on the same
// agent stream keeps flowing while the deaf frontend holds its queue, the
// deaf frontend's stream is ended after FrontendWriteTimeout and its
// connection closed at the agent, and the agent stream stays.
func TestGRPCFrontendThatNeverReadsIsEnded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, FrontendWriteTimeout: slowFrontendTimeout})
	a := startAgent(t, e, agentOpts{id: "a1"})
	waitBackends(t, e, 1)
	established := gaugeOf(t, reg, "konnectivity_network_proxy_server_established_connections", nil)
	frontends := gaugeOf(t, reg, "konnectivity_network_proxy_server_grpc_connections", map[string]string{"service_method": "ProxyService/Proxy"})

	// The well-behaved tunnel, through the same agent stream.
	echo, br, code := connectVia(t, e, http.MethodConnect, echoServer(t))
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, echoOnce(echo, br, 0))

	// The deaf frontend's tunnel goes to a target that writes without end.
	bulk, bulkEnded := endlessWriter(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()
	deaf, err := adversary.DialDeafFrontend(ctx, adversary.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer deaf.Close()
	_, err = deaf.Dial(bulk, 1)
	require.NoError(t, err)
	require.Equal(t, 2.0, established())

	// The other tunnel flows while the deaf one is full (it may wait for
	// at most the timeout, never for the deaf frontend to read).
	for i := 1; i <= 3; i++ {
		require.NoError(t, echoOnce(echo, br, i), "round trip %d beside the deaf frontend", i)
	}

	// The deaf frontend is ended, its connection closed at the agent.
	select {
	case <-bulkEnded:
	case <-time.After(waitFor + slowFrontendTimeout):
		t.Fatal("the deaf frontend's connection at the agent was never closed")
	}
	require.Eventually(t, func() bool { return frontends() == 0 && established() == 1 }, waitFor, 5*time.Millisecond,
		"the deaf frontend was not ended (frontend streams %v, established %v)", frontends(), established())
	assert.Error(t, deaf.WaitEnded(), "the deaf frontend's stream ended without an error status")

	// The agent stream and the other tunnel are still there.
	require.NoError(t, echoOnce(echo, br, 4))
	assert.Equal(t, 1, e.srv.Backends())
	select {
	case <-a.done:
		t.Fatal("the agent stream ended")
	default:
	}
}

// An HTTP CONNECT client that never reads costs only its own tunnel
// (issue 10, item 7): the other tunnels of the agent keep flowing, and
// the deaf client's connection is closed after FrontendWriteTimeout, at
// the server and at the agent.
func TestHTTPConnectClientThatNeverReadsIsClosed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, FrontendWriteTimeout: slowFrontendTimeout})
	a := startAgent(t, e, agentOpts{id: "a1"})
	waitBackends(t, e, 1)
	established := gaugeOf(t, reg, "konnectivity_network_proxy_server_established_connections", nil)

	echo, br, code := connectVia(t, e, http.MethodConnect, echoServer(t))
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, echoOnce(echo, br, 0))

	bulk, bulkEnded := endlessWriter(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()
	deaf, err := adversary.DialDeafHTTPClient(ctx, adversary.HTTPClientConfig{Addr: e.connectAddr}, bulk)
	require.NoError(t, err)
	defer deaf.Close()
	require.Equal(t, 2.0, established())

	for i := 1; i <= 3; i++ {
		require.NoError(t, echoOnce(echo, br, i), "round trip %d beside the deaf client", i)
	}

	select {
	case <-bulkEnded:
	case <-time.After(waitFor + slowFrontendTimeout):
		t.Fatal("the deaf client's connection at the agent was never closed")
	}
	require.Eventually(t, func() bool { return established() == 1 }, waitFor, 5*time.Millisecond,
		"the deaf client's tunnel is still established")
	_, err = deaf.WaitClosed(ctx)
	require.NoError(t, err, "the server did not close the deaf client's connection")

	require.NoError(t, echoOnce(echo, br, 4))
	assert.Equal(t, 1, e.srv.Backends())
	select {
	case <-a.done:
		t.Fatal("the agent stream ended")
	default:
	}
}
