package proxytest

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/wire"
)

// Metric names of the flow-control tests.
const (
	metricServerQueued  = "servercount_server_queued_bytes"
	metricAgentQueued   = "servercount_agent_queued_bytes"
	metricServerPackets = "konnectivity_network_proxy_server_stream_packets_total"
	metricAgentPackets  = "konnectivity_network_proxy_agent_stream_packets_total"
)

// forever stands for a timeout that never passes in a test: with it, a
// receive loop that waited for one slow tunnel would wait for the rest of
// the test, and the tunnel beside it would stall visibly.
const forever = time.Hour

// endlessTarget writes to every connection until the write fails.
func endlessTarget(t *testing.T) *nettest.Target {
	return nettest.StartTarget(t, func(c net.Conn) {
		_ = nettest.WriteUntilFailed(c)
	})
}

// deafTarget accepts connections and never reads them, until release
// closes them (or the test ends).
func deafTarget(t *testing.T) (target *nettest.Target, release func()) {
	stop := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(stop) }) }
	target = nettest.StartTarget(t, func(net.Conn) { <-stop })
	t.Cleanup(release) // runs before the target's Close
	return target, release
}

// echoTarget sends back what it reads.
func echoTarget(t *testing.T) *nettest.Target {
	return nettest.StartTarget(t, Echo)
}

// echoBeside opens a tunnel to echo and makes a round trip through it: the
// test that a tunnel beside a stalled one still flows.
func echoBeside(t *testing.T, dial DialFunc, echo string, round int) {
	t.Helper()
	within(t, 3*waitFor, fmt.Sprintf("round trip %d beside the stalled tunnel", round), func() {
		ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
		defer cancel()
		c, err := dial(ctx, echo)
		if !assert.NoError(t, err, "dial the echo target beside the stalled tunnel") {
			return
		}
		defer c.Close()
		msg := fmt.Appendf(nil, "ping %d", round)
		_, err = c.Write(msg)
		assert.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		assert.NoError(t, err)
		assert.Equal(t, string(msg), string(got))
	})
}

// highWater polls a gauge and remembers the highest value seen, so that a
// bound can be checked on every look, not only the last.
type highWater struct {
	mu      sync.Mutex
	highest float64
	read    func() float64
}

func (h *highWater) look() float64 {
	v := h.read()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.highest = max(h.highest, v)
	return v
}

func (h *highWater) max() float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.highest
}

// stuckBeside waits until a tunnel that is stuck has filled at least half
// of its window, as queued reads it, then makes round trips through other
// tunnels beside it: they must flow, over the same agent stream, which
// must stay. never is the failure if the window does not fill.
func stuckBeside(t *testing.T, f fixture, dial DialFunc, echo string, queued *highWater, never string) {
	t.Helper()
	require.Eventually(t, func() bool { return queued.look() >= wire.DefaultTunnelWindow/2 }, 3*waitFor, tick, never)
	for i := 1; i <= 3; i++ {
		echoBeside(t, dial, echo, i)
		queued.look()
	}
	assert.Equal(t, 1, f.srv.Core().Backends(), "the agent stream was dropped")
}

// requireFreed waits until the stuck tunnel is gone from every hop: no
// tunnel established at the server, nothing queued, no endpoint at the
// agent.
func requireFreed(t *testing.T, f fixture, queued *highWater, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return metric(t, f.srv.Registry(), metricEstablished) == 0 && queued.look() == 0 &&
			metric(t, f.agent.Registry(), metricAgentEndpoints) == 0
	}, waitFor, tick, msg)
}

// deafFrontends open a tunnel and never read from it, one per frontend
// mode; the tunnel lives until the returned close.
var deafFrontends = map[string]func(t *testing.T, s *Server, addr string) (close func()){
	// A ProxyService stream whose client reads nothing at all (the
	// konnectivity-client library would give up after its own 10 s read
	// timeout).
	"grpc": func(t *testing.T, s *Server, addr string) func() {
		// The stream lives as long as its context: the test's.
		deaf, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: s.GRPCFrontendAddr(), TLS: s.frontendTLS})
		require.NoError(t, err)
		_, err = deaf.Dial(addr, 1)
		require.NoError(t, err)
		return deaf.Close
	},
	"http-connect": func(t *testing.T, s *Server, addr string) func() {
		ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
		defer cancel()
		c, err := s.DialHTTPConnect(ctx, addr)
		require.NoError(t, err)
		return func() { c.Close() }
	},
}

// One frontend that does not read costs only its own
// tunnel. With flow control between our agent and our server, the deaf
// frontend's tunnel fills its window and stops there, while another tunnel
// through the same agent stream keeps flowing. FrontendWriteTimeout is
// "forever": without flow control, the agent stream's data would wait
// behind the deaf frontend for all of it, and the round trips would stall.
func TestFlowControlDeafFrontendCostsOnlyItsTunnel(t *testing.T) {
	for _, mode := range frontendModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := startFixture(t, ServerOptions{FrontendWriteTimeout: forever}, nil)
			dial := mode.dial(f.srv)
			echo, endless := echoTarget(t), endlessTarget(t)
			closeDeaf := deafFrontends[mode.name](t, f.srv, endless.Addr())
			defer closeDeaf()

			// The deaf frontend's tunnel fills its window at the server,
			// and holds no more than the window and the frontend's own
			// queue (32 packets, one more being sent).
			queued := &highWater{read: func() float64 { return metric(t, f.srv.Registry(), metricServerQueued) }}
			stuckBeside(t, f, dial, echo.Addr(), queued, "the deaf frontend's tunnel never filled its window at the server")
			assert.LessOrEqual(t, queued.max(), float64(wire.DefaultTunnelWindow+34*wire.MaxDataPayload),
				"the server held more for the deaf frontend than its window and queue")

			// Once the deaf frontend goes, everything it held is freed.
			closeDeaf()
			requireFreed(t, f, queued, "the deaf frontend's tunnel was not freed")
		})
	}
}

// The endpoint's side: an endpoint that does not read
// costs only its own tunnel. The frontend writing to it runs out of credit
// and waits, the agent holds no more than the window for it, and another
// tunnel through the same agent stream keeps flowing. EndpointWriteTimeout
// is "forever", so without flow control the agent's receive loop would
// wait for the deaf endpoint for the rest of the test.
func TestFlowControlDeafEndpointCostsOnlyItsTunnel(t *testing.T) {
	for _, mode := range frontendModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			f := startFixture(t, ServerOptions{}, func(cfg *agent.Config) { cfg.EndpointWriteTimeout = forever })
			dial := mode.dial(f.srv)
			echo := echoTarget(t)
			deafEndpoint, release := deafTarget(t)

			ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
			defer cancel()
			c, err := dial(ctx, deafEndpoint.Addr())
			require.NoError(t, err)
			defer c.Close()
			// The frontend writes until the tunnel stops taking data; the
			// write fails when the test closes the connection.
			writerDone := make(chan struct{})
			go func() {
				defer close(writerDone)
				_ = nettest.WriteUntilFailed(c)
			}()

			queued := &highWater{read: func() float64 { return metric(t, f.agent.Registry(), metricAgentQueued) }}
			stuckBeside(t, f, dial, echo.Addr(), queued, "the deaf endpoint's tunnel never filled its window at the agent")
			assert.LessOrEqual(t, queued.max(), float64(wire.DefaultTunnelWindow),
				"the agent held more for the deaf endpoint than its window")

			// When the endpoint goes, the tunnel ends at every hop and
			// the frontend's blocked write fails.
			release()
			select {
			case <-writerDone:
			case <-time.After(3 * waitFor):
				t.Fatal("the frontend's write did not fail when the endpoint went")
			}
			requireFreed(t, f, queued, "the deaf endpoint's tunnel was not freed")
		})
	}
}

// Flow control is on only when both ends offer it: with either end set to
// -1 (as with an upstream peer) no WINDOW packet crosses, and tunnels work
// as upstream's. With both on, 8 MiB each way cost WINDOW packets.
func TestFlowControlNeedsBothEnds(t *testing.T) {
	const size = 8 << 20
	for _, tc := range []struct {
		name          string
		server, agent int
		windows       bool
	}{
		{name: "both", windows: true},
		{name: "server-off", server: -1},
		{name: "agent-off", agent: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := startFixture(t, ServerOptions{TunnelWindow: tc.server}, func(cfg *agent.Config) { cfg.TunnelWindow = tc.agent })
			echo := echoTarget(t)
			ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
			defer cancel()
			c, err := f.srv.DialHTTPConnect(ctx, echo.Addr())
			require.NoError(t, err)
			defer c.Close()

			sent := nettest.Pattern(0, size)
			writeErr := make(chan error, 1)
			go func() {
				_, err := c.Write(sent)
				writeErr <- err
			}()
			got := make([]byte, size)
			w := newStallWatch(t, 3*waitFor)
			w.wait(t, "the echo of 8 MiB", func() {
				_, err = io.ReadFull(progressReader{r: c, w: w}, got)
			})
			require.NoError(t, err)
			require.NoError(t, <-writeErr)
			require.Equal(t, sent, got, "bytes lost or out of order")

			windows := metric(t, f.srv.Registry(), metricServerPackets, "segment", "from_agent", "packet_type", "WINDOW") +
				metric(t, f.agent.Registry(), metricAgentPackets, "segment", "to_agent", "packet_type", "WINDOW")
			if tc.windows {
				assert.Positive(t, windows, "no WINDOW packet crossed with flow control on both ends")
			} else {
				assert.Equal(t, -2.0, windows, "WINDOW packets crossed although one end has no flow control")
			}
		})
	}
}
