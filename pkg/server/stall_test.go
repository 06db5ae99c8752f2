package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// The liveness backstop: an agent stream on which nothing moves
// while packets wait to be sent is ended within its bound, logged at
// level 0 and counted, so that its agent dials again. An idle stream with
// nothing waiting is left alone.
func TestStalledAgentStreamIsEnded(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	reg := prometheus.NewPedanticRegistry()
	log := logs.Capture(t)
	e := startEnv(t, server.Config{Registerer: reg, StreamStallTimeout: stall})
	stalled := gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "stalled"})

	// An agent that never reads, with a frontend sending to it until its
	// HTTP/2 window and then its queue are full: the writer waits in
	// Send, and nothing else moves.
	_, stop := floodAgent(t, e, "deaf", 64<<10)
	require.Eventually(t, func() bool { return stalled() == 1 && e.srv.Backends() == 0 }, waitFor, 5*time.Millisecond,
		"the stalled agent stream was not ended")
	assert.Contains(t, log.String(), "Ended an agent stream on which nothing moved while packets waited")
	stop()

	// An agent that reads nothing but has nothing waiting for it stays,
	// however long it is idle.
	a, err := connectAgent(t, e, agentOpts{id: "idle"})
	require.NoError(t, err)
	defer a.Close()
	waitBackends(t, e, 1)
	assert.Never(t, func() bool { return e.srv.Backends() != 1 }, 8*stall, stall/4, "an idle agent stream was ended")
	assert.Equal(t, float64(1), stalled(), "an idle stream was counted as stalled")
}

// A gRPC frontend's receive loop never waits for one tunnel's
// flow-control credit. The agent grants none for tunnel 1 while the
// frontend sends it more than the window; the frontend's DATA and
// CLOSE_REQ for tunnel 2, sent after, still reach the agent, before
// tunnel 1 is given up. When tunnel 1 has a window's worth waiting too
// and the agent still grants nothing for FrontendWriteTimeout, tunnel 1
// alone is ended, at both ends, and counted.
func TestGRPCFrontendDoesNotWaitForOneTunnelsCredit(t *testing.T) {
	t.Parallel()
	const window = 64 << 10
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, TunnelWindow: window, FrontendWriteTimeout: 5 * time.Second})
	noCredit := gaugeOf(reg, "servercount_server_tunnels_ended_total", map[string]string{"reason": "no_credit"})
	a, err := connectAgent(t, e, agentOpts{id: "stingy", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(window)}})
	require.NoError(t, err)
	waitBackends(t, e, 1)

	f, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer f.Close()
	for i, random := range []int64{7, 8} {
		accepted := make(chan error, 1)
		go func() { _, err := a.AcceptDial(int64(i + 1)); accepted <- err }()
		id, err := f.Dial("127.0.0.1:9", random)
		require.NoError(t, err)
		require.NoError(t, <-accepted)
		require.Equal(t, int64(i+1), id)
	}

	// Tunnel 1: the whole window, then as much again, which finds no
	// credit. Tunnel 2: a few bytes and CLOSE_REQ.
	chunk := make([]byte, window)
	require.NoError(t, f.Send(wire.Data(1, chunk)))
	require.NoError(t, f.Send(wire.Data(1, chunk)))
	require.NoError(t, f.Send(wire.Data(2, []byte("beside"))))
	require.NoError(t, f.Send(wire.CloseReq(2)))

	// The agent reads: tunnel 1's window, then tunnel 2's packets, and
	// no CLOSE_REQ for tunnel 1 before them.
	var got1 int
	var saw2Data, saw2Close bool
	for !saw2Close {
		p, err := recvWithin(a, waitFor)
		require.NoError(t, err, "tunnel 2's packets never reached the agent: the frontend's receive loop waited for tunnel 1's credit")
		switch {
		case p.GetType() == client.PacketType_DATA && p.GetData().GetConnectID() == 1:
			got1 += len(p.GetData().GetData())
		case p.GetType() == client.PacketType_DATA && p.GetData().GetConnectID() == 2:
			saw2Data = true
		case p.GetType() == client.PacketType_CLOSE_REQ && p.GetCloseRequest().GetConnectID() == 2:
			saw2Close = true
		case p.GetType() == client.PacketType_CLOSE_REQ:
			t.Fatalf("tunnel %d was closed before tunnel 2's packets went", p.GetCloseRequest().GetConnectID())
		}
	}
	assert.True(t, saw2Data, "tunnel 2's DATA did not reach the agent before its CLOSE_REQ")
	assert.Equal(t, window, got1, "tunnel 1 sent beyond its credit")

	// More for tunnel 1 than its outbox holds: the frontend's loop waits
	// for room, at most FrontendWriteTimeout, then tunnel 1 is ended.
	require.NoError(t, f.Send(wire.Data(1, chunk)))
	require.NoError(t, f.Send(wire.Data(1, chunk)))
	for {
		p, err := recvWithin(a, 3*waitFor)
		require.NoError(t, err, "the agent never got CLOSE_REQ for the tunnel without credit")
		if p.GetType() == client.PacketType_CLOSE_REQ && p.GetCloseRequest().GetConnectID() == 1 {
			break
		}
		require.NotEqual(t, client.PacketType_DATA, p.GetType(), "data went beyond the credit")
	}
	for {
		p, err := f.Recv()
		require.NoError(t, err, "the frontend never got CLOSE_RSP for the tunnel without credit")
		if p.GetType() == client.PacketType_CLOSE_RSP && p.GetCloseResponse().GetConnectID() == 1 {
			assert.True(t, strings.Contains(p.GetCloseResponse().GetError(), "credit"), "CLOSE_RSP error %q does not say why", p.GetCloseResponse().GetError())
			break
		}
	}
	assert.Equal(t, float64(1), noCredit())
	assert.Equal(t, 1, e.srv.Backends(), "the agent stream was dropped")
}

// recvWithin reads the agent's next packet, failing after d.
func recvWithin(a *adversarytest.DeafAgent, d time.Duration) (*client.Packet, error) {
	type result struct {
		p   *client.Packet
		err error
	}
	ch := make(chan result, 1)
	go func() {
		p, err := a.Recv()
		ch <- result{p, err}
	}()
	select {
	case r := <-ch:
		return r.p, r.err
	case <-time.After(d):
		return nil, context.DeadlineExceeded
	}
}

// controlEnv starts a Server whose streams end for their control backlog
// and not for a stall, and returns it with its registry and readers of
// its queued control packets and of the streams it ended for their
// backlog.
func controlEnv(t *testing.T) (e *env, reg *prometheus.Registry, queued, backlog func() float64) {
	reg = prometheus.NewPedanticRegistry()
	e = startEnv(t, server.Config{Registerer: reg, StreamStallTimeout: -1})
	queued = gaugeOf(reg, "servercount_server_control_queued_packets", nil)
	backlog = gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "control_backlog"})
	return e, reg, queued, backlog
}

// The server answers an agent without waiting, so an agent that stops
// reading can make it queue answers; the queue is bounded: past the
// bound the stream is ended (and counted), freeing the queue. (That an
// answer for the same connection is queued once is
// TestControlAnswersAreQueuedOnce.)
//
// The agent's DATA for unknown connections, each answered with
// CLOSE_REQ, goes on until the stream ends: a few answers may still go
// out while the writer has window left, the rest wait. The queue never
// holds more than MaxControl, and the stream ends only once it would:
// after at least MaxControl more answers than were sent. (The test once
// waited for exactly MaxControl queued, which the answers sent before
// the writer was stuck could keep from happening.)
//
// Not parallel, as TestClosingEveryTunnelAtOnceKeepsTheStream: thousands
// of packets through the race detector, which the package's parallel
// tests once starved past the wait (40 s) on a loaded machine.
func TestControlQueueIsBounded(t *testing.T) {
	e, reg, queued, backlog := controlEnv(t)
	closesSent := gaugeOf(reg, "konnectivity_network_proxy_server_stream_packets_total", map[string]string{"segment": "to_agent", "packet_type": "CLOSE_REQ"})

	// As above: the agent reads nothing, and the server's writer waits
	// in Send behind a frontend's data.
	a, stop := floodAgent(t, e, "deaf", 64<<10)
	waiting := gaugeOf(reg, "servercount_server_frontends_waiting_for_agent", nil)
	require.Eventually(t, func() bool { return waiting() == 1 }, waitFor, 5*time.Millisecond, "the agent's queue never filled")

	most, id := 0.0, int64(1)
	for ; id <= 3*server.MaxControl && a.Send(wire.Data(1<<40+id, []byte("x"))) == nil; id++ {
		if id%64 == 0 {
			most = max(most, queued())
			if backlog() == 1 {
				break
			}
		}
	}
	// Thousands of packets through the race detector: on a machine that
	// other packages' tests load, give them longer than waitFor.
	require.Eventually(t, func() bool {
		most = max(most, queued())
		return backlog() == 1 && queued() == 0 && e.srv.Backends() == 0
	}, 4*waitFor, 5*time.Millisecond, "the stream over its control bound was not ended")
	assert.LessOrEqual(t, most, float64(server.MaxControl), "control packets queued at once")
	assert.GreaterOrEqual(t, float64(id), float64(server.MaxControl)+closesSent(), "the stream was ended before its queue passed the bound")
	stop()
}

// During a graceful stop a frontend stream stays open, and a
// dial it asks for is answered at once with an error, not left to the
// client's own timeout; the stream's end then lets Shutdown return
// without cutting anything.
func TestShutdownAnswersNewDialsOnOpenStreams(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e, _ := startEnvAndAgent(t, server.Config{Registerer: reg})
	f, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer f.Close()
	frontends := gaugeOf(reg, "konnectivity_network_proxy_server_grpc_connections", map[string]string{"service_method": "Proxy"})
	require.Eventually(t, func() bool { return frontends() == 1 }, waitFor, 5*time.Millisecond)

	cut := make(chan int, 1)
	go func() { cut <- e.srv.Shutdown(t.Context()) }()
	require.Eventually(t, func() bool { return !e.srv.Ready() }, waitFor, 5*time.Millisecond, "still ready while shutting down")
	// Shutdown waits for the open frontend stream; a dial on it is
	// refused with an answer.
	_, err = f.Dial("127.0.0.1:9", 42)
	require.ErrorContains(t, err, "shutting down")
	select {
	case n := <-cut:
		t.Fatalf("Shutdown returned (cut %d) with a frontend stream open", n)
	default:
	}
	f.Close()
	select {
	case n := <-cut:
		assert.Zero(t, n, "tunnels cut")
	case <-time.After(waitFor):
		t.Fatal("Shutdown did not return once the frontend had gone")
	}
}

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
		_ = nettest.WriteUntilFailed(c)
		done <- struct{}{}
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

// deafFrontend opens a tunnel to addr from a frontend that never reads,
// and returns a check that the server ended that frontend (nil when it
// did, as it should).
type deafFrontend func(ctx context.Context, t *testing.T, e *env, addr string) (ended func() error)

var deafFrontends = []struct {
	name string
	open deafFrontend
}{
	{"grpc", func(ctx context.Context, t *testing.T, e *env, addr string) func() error {
		deaf, err := adversarytest.DialDeafFrontend(ctx, adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
		require.NoError(t, err)
		t.Cleanup(deaf.Close)
		_, err = deaf.Dial(addr, 1)
		require.NoError(t, err)
		return func() error {
			if deaf.WaitEnded() == nil {
				return errors.New("the deaf frontend's stream ended without an error status")
			}
			return nil
		}
	}},
	{"http-connect", func(ctx context.Context, t *testing.T, e *env, addr string) func() error {
		deaf, err := adversarytest.DialDeafHTTPClient(ctx, adversarytest.HTTPClientConfig{Addr: e.connectAddr}, addr)
		require.NoError(t, err)
		t.Cleanup(func() { deaf.Close() })
		return func() error { _, err := deaf.WaitClosed(ctx); return err }
	}},
}

// A frontend that opens a tunnel and never reads costs only its own
// tunnel, with an agent that does not offer flow control, as upstream's
// (with flow control see internal/proxytest's
// TestFlowControlDeafFrontendCostsOnlyItsTunnel): another tunnel on the
// same agent stream keeps flowing, waiting at most FrontendWriteTimeout;
// the deaf frontend is then ended at the server and its connection closed
// at the agent, and the agent stream stays.
func TestFrontendThatNeverReadsIsEnded(t *testing.T) {
	for _, mode := range deafFrontends {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			e, a := startEnvAndAgent(t, server.Config{Registerer: reg, FrontendWriteTimeout: slowFrontendTimeout})
			established := gaugeOf(reg, "konnectivity_network_proxy_server_established_connections", nil)
			frontends := gaugeOf(reg, "konnectivity_network_proxy_server_grpc_connections", map[string]string{"service_method": "Proxy"})

			// The well-behaved tunnel, through the same agent stream.
			echo, br, code := connectVia(t, e, http.MethodConnect, echoServer(t))
			require.Equal(t, http.StatusOK, code)
			require.NoError(t, echoOnce(echo, br, 0))

			// The deaf frontend's tunnel goes to a target that writes
			// without end.
			bulk, bulkEnded := endlessWriter(t)
			ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
			defer cancel()
			ended := mode.open(ctx, t, e, bulk)
			require.Equal(t, 2.0, established())

			// The other tunnel flows while the deaf one is full (it may
			// wait for at most the timeout, never for the deaf frontend
			// to read).
			for i := 1; i <= 3; i++ {
				require.NoError(t, echoOnce(echo, br, i), "round trip %d beside the deaf frontend", i)
			}

			// The deaf frontend is ended, its connection closed at the
			// agent.
			select {
			case <-bulkEnded:
			case <-time.After(waitFor + slowFrontendTimeout):
				t.Fatal("the deaf frontend's connection at the agent was never closed")
			}
			require.Eventually(t, func() bool { return frontends() == 0 && established() == 1 }, waitFor, 5*time.Millisecond,
				"the deaf frontend was not ended (frontend streams %v, established %v)", frontends(), established())
			require.NoError(t, ended())

			// The agent stream and the other tunnel are still there.
			require.NoError(t, echoOnce(echo, br, 4))
			assert.Equal(t, 1, e.srv.Backends())
			select {
			case <-a.done:
				t.Fatal("the agent stream ended")
			default:
			}
		})
	}
}

// The control queue's bound counts only what no tunnel accounts for: a
// frontend that goes away with more tunnels through one agent than that
// bound (kube-apiserver restarting) makes the server queue a CLOSE_REQ
// for each while the agent's stream is slow, and the stream stays. The
// agent gets every CLOSE_REQ once it reads again. The stream is full: it
// holds as many tunnels as our agent's default bound allows.
func TestClosingEveryTunnelAtOnceKeepsTheStream(t *testing.T) {
	e, reg, queued, backlog := controlEnv(t)

	// One frontend holds n tunnels through the agent, dialled all at once
	// and answered all at once (connectID = random + 1).
	const n = 5000 // agent.DefaultMaxTunnelsPerServer
	require.Greater(t, n, server.MaxControl)
	a, err := connectAgent(t, e, agentOpts{id: "busy"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	ctx, closeMany := context.WithCancel(t.Context())
	defer closeMany()
	many, err := adversarytest.DialDeafFrontend(ctx, adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer many.Close()
	sent := make(chan error, 1)
	go func() {
		for r := int64(1); r <= n; r++ {
			if err := many.Send(wire.DialReq("tcp", "127.0.0.1:9", r)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for answered := 0; answered < n; {
		p, err := a.Recv()
		require.NoError(t, err)
		if p.GetType() == client.PacketType_DIAL_REQ {
			r := p.GetDialRequest().GetRandom()
			require.NoError(t, a.Send(wire.DialRsp(r, r+1, "")))
			answered++
		}
	}
	require.NoError(t, <-sent)
	for established := 0; established < n; {
		p, err := many.Recv()
		require.NoError(t, err)
		if p.GetType() == client.PacketType_DIAL_RSP {
			require.Empty(t, p.GetDialResponse().GetError())
			established++
		}
	}

	// A second frontend floods one more tunnel through the agent, which
	// reads nothing: the server's writer to it waits in Send.
	flood, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer flood.Close()
	accepted := make(chan error, 1)
	go func() { _, err := a.AcceptDial(1 << 40); accepted <- err }()
	_, err = flood.Dial("127.0.0.1:9", 1<<40)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		data := make([]byte, 64<<10)
		for flood.Send(wire.Data(1<<40, data)) == nil {
		}
	}()
	waiting := gaugeOf(reg, "servercount_server_frontends_waiting_for_agent", nil)
	require.Eventually(t, func() bool { return waiting() == 1 }, waitFor, 5*time.Millisecond, "the agent's queue never filled")

	// The first frontend goes: n CLOSE_REQs wait for the agent (but for
	// any the writer sent before the window ran out).
	closesSent := gaugeOf(reg, "konnectivity_network_proxy_server_stream_packets_total", map[string]string{"segment": "to_agent", "packet_type": "CLOSE_REQ"})
	closeMany()
	require.Eventually(t, func() bool { return queued()+closesSent() == n }, 4*waitFor, 5*time.Millisecond, "the CLOSE_REQs were not queued")
	require.Equal(t, float64(0), backlog(), "the stream was ended for closing its own tunnels")
	require.Equal(t, 1, e.srv.Backends())

	// The flood ends and the agent reads again: every tunnel's CLOSE_REQ
	// arrives.
	flood.Close()
	<-flooded
	closed := map[int64]bool{}
	for len(closed) < n {
		p, err := a.Recv()
		require.NoError(t, err)
		if p.GetType() == client.PacketType_CLOSE_REQ && p.GetCloseRequest().GetConnectID() <= n+1 {
			closed[p.GetCloseRequest().GetConnectID()] = true
		}
	}
	require.Eventually(t, func() bool { return queued() == 0 }, waitFor, 5*time.Millisecond)
	require.Equal(t, float64(0), backlog())
}
