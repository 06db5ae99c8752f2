package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// An agent that turns flow control on and then sends more than the
// server's window for a tunnel whose frontend does not read loses that
// tunnel: the server closes it at the agent (CLOSE_REQ) and at the
// frontend, holds no more than the window for it, and keeps the agent
// stream. FrontendWriteTimeout is an hour: the tunnel must end for its
// overrun, not for a timeout.
func TestAgentOverrunningTheWindowLosesTheTunnel(t *testing.T) {
	t.Parallel()
	const window = 64 << 10
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, FrontendWriteTimeout: time.Hour, TunnelWindow: window})
	// The test agent offers a window and then sends all it reads,
	// whatever credit it has.
	a := startAgent(t, e, agentOpts{id: "a1", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(window)}})
	waitBackends(t, e, 1)
	established := gaugeOf(reg, "konnectivity_network_proxy_server_established_connections", nil)
	queued := gaugeOf(reg, "servercount_server_queued_bytes", nil)

	bulk, _ := endlessWriter(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()
	deaf, err := adversarytest.DialDeafHTTPClient(ctx, adversarytest.HTTPClientConfig{Addr: e.connectAddr}, bulk)
	require.NoError(t, err)
	defer deaf.Close()

	select {
	case <-a.closeCh:
	case <-time.After(3 * waitFor):
		t.Fatal("the server did not close the overrun tunnel at the agent")
	}
	_, err = deaf.WaitClosed(ctx)
	require.NoError(t, err, "the server did not close the overrun tunnel's client")
	require.Eventually(t, func() bool { return established() == 0 && queued() == 0 }, waitFor, 5*time.Millisecond,
		"the overrun tunnel is still held (established %v, queued bytes %v)", established(), queued())
	assert.Equal(t, 1, e.srv.Backends(), "the agent stream was dropped")
}

// sizedWriter starts a TCP server that writes size bytes of a pattern to
// each connection and closes it.
func sizedWriter(t *testing.T, size int) string {
	t.Helper()
	return serveConns(t, func(c net.Conn) { _, _ = c.Write(nettest.Pattern(0, size)) })
}

// When the agent closes a flow-controlled tunnel (its endpoint sent
// everything and closed), the data the server still holds for a frontend
// that reads slowly reaches it before the CLOSE_RSP, even when the
// frontend sends on the tunnel in between: nothing it sends may be
// answered ahead of the data, or cut the tunnel short.
func TestAgentCloseDeliversQueuedDataFirst(t *testing.T) {
	const size = 8 << 20
	for _, mode := range []string{"grpc", "http-connect"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			// A window larger than what the endpoint sends: the test
			// agent sends all it reads at once, without credit.
			e := startEnv(t, server.Config{Registerer: reg, FrontendWriteTimeout: time.Hour, TunnelWindow: 64 << 20})
			startAgent(t, e, agentOpts{id: "a1", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(wire.DefaultTunnelWindow)}})
			waitBackends(t, e, 1)
			established := gaugeOf(reg, "konnectivity_network_proxy_server_established_connections", nil)
			target := sizedWriter(t, size)

			var send func() error     // sends data on the tunnel
			var receive func() []byte // reads everything the frontend gets, in order, until the tunnel ends
			switch mode {
			case "grpc":
				fe, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
				require.NoError(t, err)
				defer fe.Close()
				id, err := fe.Dial(target, 7)
				require.NoError(t, err)
				send = func() error { return fe.Send(wire.Data(id, []byte("more from the frontend"))) }
				receive = func() []byte {
					var got []byte
					for {
						p, err := fe.Recv()
						require.NoError(t, err, "the stream ended before the CLOSE_RSP")
						switch p.GetType() {
						case client.PacketType_DATA:
							got = append(got, p.GetData().GetData()...)
						case client.PacketType_CLOSE_RSP:
							return got
						}
					}
				}
			case "http-connect":
				c, br, code := connectVia(t, e, http.MethodConnect, target)
				require.Equal(t, http.StatusOK, code)
				require.NoError(t, c.SetDeadline(time.Time{}))
				send = func() error { _, err := c.Write([]byte("more from the client")); return err }
				receive = func() []byte {
					got, err := io.ReadAll(br)
					require.NoError(t, err)
					return got
				}
			}
			// The agent has closed the tunnel while the frontend read
			// nothing; the frontend now sends on it, then reads.
			require.Eventually(t, func() bool { return established() == 0 }, waitFor, 5*time.Millisecond, "the agent never closed the tunnel")
			for range 3 {
				require.NoError(t, send())
			}
			got := receive()
			require.Equal(t, size, len(got), "the frontend got %d of the %d bytes sent before the agent closed", len(got), size)
			require.Equal(t, nettest.Pattern(0, size), got, "bytes out of order")
		})
	}
}

// An idle HTTP CONNECT tunnel holds one goroutine on the server, its
// serveTunnel reading the client: a pump and a writer run only while there is
// data for the client, and go once it is written. Not parallel: it counts
// the process's goroutines.
func TestIdleConnectTunnelHoldsOneGoroutine(t *testing.T) {
	e := startEnv(t, server.Config{})
	startAgent(t, e, agentOpts{id: "a1", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(wire.DefaultTunnelWindow)}})
	waitBackends(t, e, 1)
	target := echoServer(t)
	const n = 20
	clients := make([]*bufio.ReadWriter, n)
	for i := range n {
		c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
		_, err = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		require.NoError(t, err)
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		rsp, err := http.ReadResponse(rw.Reader, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, rsp.StatusCode)
		clients[i] = rw
	}
	const (
		serving = "github.com/servercount/servercount/pkg/server.(*frontends).serveTunnel"
		writer  = "github.com/servercount/servercount/pkg/server.(*httpTunnel).writeLoop"
		pump    = "github.com/servercount/servercount/pkg/server.(*relay).pump"
	)
	idle := func() bool {
		return metricstest.GoroutinesIn(serving) == n && metricstest.GoroutinesIn(writer) == 0 && metricstest.GoroutinesIn(pump) == 0
	}
	require.Eventually(t, idle, waitFor, 5*time.Millisecond, "%d relays, %d writers, %d pumps for %d idle tunnels",
		metricstest.GoroutinesIn(serving), metricstest.GoroutinesIn(writer), metricstest.GoroutinesIn(pump), n)

	// A round trip through one tunnel: the echo comes back, and the pump
	// and writer that carried it go.
	_, err := clients[5].WriteString("ping")
	require.NoError(t, err)
	require.NoError(t, clients[5].Flush())
	got := make([]byte, 4)
	_, err = io.ReadFull(clients[5], got)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
	require.Eventually(t, idle, waitFor, 5*time.Millisecond, "the pump or the writer stayed after the data was written")
}

// TestIdleStreamsHoldNoWriter holds agent streams and a gRPC frontend's
// stream with a tunnel open through one of them, all idle: no stream has
// a writer goroutine, though each had one to carry the handshake's and
// the dial's packets. A packet queued later starts one again, which goes
// once it is sent.
func TestIdleStreamsHoldNoWriter(t *testing.T) {
	const writer = "github.com/servercount/servercount/pkg/server.(*peer).writeLoop"
	idle := func() bool { return metricstest.GoroutinesIn(writer) == 0 }
	e := startEnv(t, server.Config{})
	a, f := tunnelThroughAgent(t, t.Context(), e, "a1")
	require.Eventually(t, idle, waitFor, 5*time.Millisecond,
		"%d writers for 2 idle streams", metricstest.GoroutinesIn(writer))

	// A second dial on the frontend's stream: the server's writers carry
	// the DIAL_REQ to the agent and the DIAL_RSP back, and go.
	dialThrough(t, a, f, 8, 2)

	for _, id := range []string{"a2", "a3"} {
		startAgent(t, e, agentOpts{id: id})
	}
	waitBackends(t, e, 3)
	require.Eventually(t, idle, waitFor, 5*time.Millisecond,
		"%d writers for 4 idle streams", metricstest.GoroutinesIn(writer))
}
