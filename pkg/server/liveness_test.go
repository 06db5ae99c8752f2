package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// heartbeatMD is the handshake header of an agent that offers
// heartbeats every d.
func heartbeatMD(d time.Duration) []string {
	return []string{wire.HeaderHeartbeat, wire.FormatHeartbeat(d)}
}

// An agent that offered heartbeats and then sends nothing (a stopped
// process, a black hole, a frozen relay: the TCP connection stays) is
// ended within wire.SilenceLimit of its interval, counted as silent, and
// its pending dial fails at once, saying why.
func TestSilentAgentIsEndedAndItsDialFails(t *testing.T) {
	t.Parallel()
	// Longer than the 40 ms of the other tests: the agent's heartbeats
	// must keep it until the dial, however late a loaded machine runs
	// their sender.
	const heartbeat = 200 * time.Millisecond
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, Heartbeat: heartbeat})
	a, err := connectAgent(t, e, agentOpts{id: "silent", extraMD: heartbeatMD(heartbeat)})
	require.NoError(t, err)
	assert.Equal(t, []string{wire.FormatHeartbeat(heartbeat)}, a.Header().Get(wire.HeaderHeartbeat), "the server did not take up the offer")
	waitBackends(t, e, 1)

	// The agent sends HEARTBEATs until the dial reaches it and then falls
	// silent: its silence must not end it before the frontend, slow to
	// connect on a loaded machine, has dialled.
	heard := make(chan struct{}) // closed once it stops reading: the dial came, or the stream ended
	var wg sync.WaitGroup
	defer func() {
		a.Close() // ends the two below if the dial never came
		wg.Wait()
	}()
	wg.Go(func() {
		defer close(heard)
		for {
			p, err := a.Recv()
			if err != nil || p.GetType() == client.PacketType_DIAL_REQ {
				return
			}
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(heartbeat / 4)
		defer tick.Stop()
		for {
			select {
			case <-heard:
				return
			case <-tick.C:
				if a.Send(wire.Heartbeat()) != nil {
					return
				}
			}
		}
	})

	f, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Dial("127.0.0.1:9", 5)
	require.ErrorContains(t, err, "agent stream closed before the dial completed: the agent sent nothing")
	waitBackends(t, e, 0)
	assert.Equal(t, 1.0, gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "silent"})())
}

// An agent that sends heartbeats keeps its stream however long it is
// idle, and gets the server's heartbeats: the agent answers each of the
// server's, and many silences' worth pass with nothing ended. The
// interval leaves a loaded machine room: the agent's answers come a
// heartbeat apart, silence is two and a half. An agent that offers none
// (upstream's) is answered without the header.
func TestHeartbeatsKeepAnIdleAgent(t *testing.T) {
	t.Parallel()
	const heartbeat = 250 * time.Millisecond
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, Heartbeat: heartbeat})
	a, err := connectAgent(t, e, agentOpts{id: "alive", extraMD: heartbeatMD(heartbeat)})
	require.NoError(t, err)
	plain, err := connectAgent(t, e, agentOpts{id: "upstream"})
	require.NoError(t, err)
	assert.Empty(t, plain.Header().Get(wire.HeaderHeartbeat), "heartbeats answered to an agent that did not offer them")
	waitBackends(t, e, 2)

	// Twelve of the server's heartbeats span about five silences.
	for n := 0; n < 12; n++ {
		p, err := recvWithin(a, waitFor)
		require.NoError(t, err, "the server's heartbeats stopped after %d", n)
		require.Equal(t, wire.PacketHeartbeat, p.GetType())
		require.NoError(t, a.Send(wire.Heartbeat()))
	}
	assert.Equal(t, 2, e.srv.Backends())
	assert.Equal(t, 0.0, gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "silent"})())
}

// httpDial asks the server's HTTP CONNECT port for a tunnel to target
// and returns the status, without require, so that goroutines may call
// it. The connection closes with the test.
func httpDial(t *testing.T, e *env, target string) (int, error) {
	c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
	if err != nil {
		return 0, err
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(2 * waitFor)); err != nil {
		return 0, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// dialAll makes n HTTP CONNECT dials to target at once and returns how
// many were answered 200.
func dialAll(t *testing.T, e *env, target string, n int) int {
	t.Helper()
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Go(func() {
			code, err := httpDial(t, e, target)
			if err != nil {
				code = 0
			}
			codes <- code
		})
	}
	wg.Wait()
	close(codes)
	ok := 0
	for c := range codes {
		if c == http.StatusOK {
			ok++
		}
	}
	return ok
}

// An agent that stops answering while its transport stays up (a lock-up,
// a stopped process, the "deaf agent") is found within
// UnansweredDialTimeout of a dial: the dials sent to it go to the other
// agent, which answers them all, it gets no new dial while another agent
// can take it, and it is told (DIAL_CLS) of each dial taken from it.
func TestUnresponsiveAgentsDialsGoToAnother(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	// Long enough that a loaded machine does not make the good agent
	// look unresponsive.
	e := startEnv(t, server.Config{Registerer: reg, UnansweredDialTimeout: time.Second})
	good := startAgent(t, e, agentOpts{id: "good"})
	deaf, err := connectAgent(t, e, agentOpts{id: "deaf"})
	require.NoError(t, err)
	waitBackends(t, e, 2)
	target := echoServer(t)
	retried := gaugeOf(reg, "servercount_server_dial_retries_total", map[string]string{"reason": "unresponsive"})
	unresponsive := gaugeOf(reg, "servercount_server_unresponsive_agent_streams", nil)

	// Half of these go to the deaf agent, by chance; all succeed. Rounds
	// until the deaf agent has had one.
	dials := 0
	for round := 0; unresponsive() == 0; round++ {
		require.Less(t, round, 10, "ten rounds of dials and the deaf agent was never taken for unresponsive")
		require.Equal(t, 20, dialAll(t, e, target, 20), "dials failed beside a deaf agent")
		dials += 20
	}
	moved := retried()
	require.Positive(t, moved)

	// It gets no new dial: none is retried from it.
	require.Equal(t, 40, dialAll(t, e, target, 40))
	dials += 40
	assert.Equal(t, moved, retried(), "new dials went to the unresponsive agent")
	assert.EqualValues(t, dials, good.dials.Load(), "the good agent did not answer every dial")

	// Each dial it was sent was taken back with DIAL_CLS: as many as
	// were retried, and no other.
	open := map[int64]bool{}
	reqs, cls := 0, 0
	for cls < int(moved) || len(open) > 0 {
		p, err := recvWithin(deaf, waitFor)
		require.NoError(t, err, "the deaf agent got %d DIAL_REQs and %d DIAL_CLS, %d retried", reqs, cls, int(moved))
		switch p.GetType() {
		case client.PacketType_DIAL_REQ:
			open[p.GetDialRequest().GetRandom()] = true
			reqs++
		case client.PacketType_DIAL_CLS:
			require.True(t, open[p.GetCloseDial().GetRandom()], "DIAL_CLS for a dial the agent never got")
			delete(open, p.GetCloseDial().GetRandom())
			cls++
		}
	}
	assert.Equal(t, int(moved), reqs, "the deaf agent got dials that were not retried")
}

// An agent alone is never taken for unresponsive (at most half the agent
// streams are): its dials wait and time out as before, and none is
// retried, as there is nowhere to send it.
func TestLoneUnresponsiveAgentKeepsItsDials(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, UnansweredDialTimeout: 20 * time.Millisecond, BackendDialTimeout: 200 * time.Millisecond})
	_, err := connectAgent(t, e, agentOpts{id: "deaf"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	for i := range 4 { // more than backendDialTimeouts in a row
		code, err := httpDial(t, e, "127.0.0.1:9")
		require.NoError(t, err)
		require.Equal(t, http.StatusGatewayTimeout, code, "dial %d", i)
	}
	assert.Equal(t, 0.0, gaugeOf(reg, "servercount_server_unresponsive_agent_streams", nil)())
	assert.Equal(t, 0.0, gaugeOf(reg, "servercount_server_dial_retries_total", map[string]string{"reason": "timeout"})())
	assert.Equal(t, 1, e.srv.Backends())
}

// An agent that stays unresponsive for StreamStallTimeout loses its
// stream.
func TestUnresponsiveAgentIsEnded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, UnansweredDialTimeout: 500 * time.Millisecond, StreamStallTimeout: time.Second})
	startAgent(t, e, agentOpts{id: "good"})
	_, err := connectAgent(t, e, agentOpts{id: "deaf"})
	require.NoError(t, err)
	waitBackends(t, e, 2)
	target := echoServer(t)
	unresponsive := gaugeOf(reg, "servercount_server_unresponsive_agent_streams", nil)
	for round := 0; unresponsive() == 0; round++ {
		require.Less(t, round, 10, "ten rounds of dials and the deaf agent was never taken for unresponsive")
		require.Equal(t, 10, dialAll(t, e, target, 10))
	}
	waitBackends(t, e, 1)
	assert.Equal(t, 1.0, gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "unresponsive"})())
	require.Eventually(t, func() bool { return unresponsive() == 0 }, waitFor, 5*time.Millisecond, "the ended stream still counts as unresponsive")
}

// With destHost, an unresponsive agent that is the only one to claim a
// host keeps its stream: that host's dials have nowhere else to go, and
// none goes to an agent that does not claim it.
func TestLastAgentOfADestHostIsKept(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{
		Registerer: reg, Strategies: []server.Strategy{server.StrategyDestHost, server.StrategyDefault},
		UnansweredDialTimeout: 50 * time.Millisecond, StreamStallTimeout: 200 * time.Millisecond, BackendDialTimeout: 2 * time.Second,
	})
	other := startAgent(t, e, agentOpts{id: "node-b", identifiers: "host=node-b"})
	_, err := connectAgent(t, e, agentOpts{id: "node-a", identifiers: "host=node-a"})
	require.NoError(t, err)
	waitBackends(t, e, 2)

	// Ten stall timeouts pass while the dial waits for its own timeout.
	code, err := httpDial(t, e, "node-a:10250")
	require.NoError(t, err)
	assert.Equal(t, http.StatusGatewayTimeout, code)
	assert.Equal(t, 1.0, gaugeOf(reg, "servercount_server_unresponsive_agent_streams", nil)())
	assert.Equal(t, 2, e.srv.Backends(), "the only agent of node-a lost its stream")
	assert.Zero(t, other.dials.Load(), "node-a's dial went to node-b's agent")
}

// dialSmallWindowFrontend opens a gRPC frontend stream that reads nothing
// and has 64 KiB windows, so that a little data fills what the server may
// send it and then its queue.
func dialSmallWindowFrontend(t *testing.T, e *env) *adversarytest.DeafFrontend {
	t.Helper()
	cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	f, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Conn: cc})
	require.NoError(t, err)
	t.Cleanup(f.Close)
	return f
}

// fillFrontend opens tunnel 1 from f through a and has a send 3 MiB on
// it, or as much as it can before its stream ends.
func fillFrontend(t *testing.T, a *adversarytest.DeafAgent, f *adversarytest.DeafFrontend) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() { _, err := a.AcceptDial(1); accepted <- err }()
	_, err := f.Dial("127.0.0.1:9", 1)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	chunk := make([]byte, 32<<10)
	for range 96 {
		if a.Send(wire.Data(1, chunk)) != nil {
			return
		}
	}
}

// The case: a gRPC frontend carrying two tunnels, its queue full,
// gets a DIAL_RSP for its second tunnel; another frontend's dial through
// the same agent stream is answered at once, not after the first
// frontend's write timeout.
func TestDialAnswerDoesNotWaitOnAFullFrontend(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, TunnelWindow: 4 << 20, FrontendWriteTimeout: 5 * waitFor})
	a, err := connectAgent(t, e, agentOpts{id: "a1", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(1 << 20)}})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	full := dialSmallWindowFrontend(t, e)
	fillFrontend(t, a, full)
	waiting := gaugeOf(reg, "servercount_server_deliveries_waiting_for_frontend", nil)
	require.Eventually(t, func() bool { return waiting() >= 1 }, waitFor, 5*time.Millisecond, "the frontend's queue never filled")

	// The full frontend's second dial, answered.
	require.NoError(t, full.Send(wire.DialReq("tcp", "127.0.0.1:9", 2)))
	req, err := a.AcceptDial(2)
	require.NoError(t, err)
	require.Equal(t, int64(2), req.GetRandom())

	// Another frontend's dial through the same agent stream.
	other, err := adversarytest.DialDeafFrontend(t.Context(), adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	defer other.Close()
	dialed := make(chan error, 1)
	go func() { _, err := other.Dial("127.0.0.1:9", 3); dialed <- err }()
	req, err = a.AcceptDial(3)
	require.NoError(t, err)
	require.Equal(t, int64(3), req.GetRandom())
	select {
	case err := <-dialed:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("a dial was held up by another frontend's full queue: the agent stream's receive loop waited on it")
	}
}

// Without flow control (an upstream agent) the receive loop waits for
// room in a frontend's queue, as upstream's protocol has no other
// back-pressure; when it has been inside one packet for StreamStallTimeout
// the backstop ends the stream.
func TestStuckReceiveLoopIsEnded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, StreamStallTimeout: 300 * time.Millisecond, FrontendWriteTimeout: 5 * waitFor})
	a, err := connectAgent(t, e, agentOpts{id: "upstream"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	f := dialSmallWindowFrontend(t, e)
	fillFrontend(t, a, f)
	waitBackends(t, e, 0)
	assert.Equal(t, 1.0, gaugeOf(reg, "servercount_server_streams_ended_total", map[string]string{"reason": "receive_stuck"})())
}

// An agent that sends HEARTBEATs but reads nothing (a receive loop
// stuck, a process half frozen) is taken for unresponsive within
// UnansweredDialTimeout of a dial, as one that sends nothing is: its
// heartbeats say it lives, not that it reads. Before, heartbeats counted
// as an answer, and it kept its dials until three BackendDialTimeouts
// (30 s) had passed. An agent that answers a slow dial's progress with
// the dial's random (wire.DialProgressHeartbeat) is not.
func TestHeartbeatingDeafAgentIsTakenForUnresponsive(t *testing.T) {
	t.Parallel()
	// The interval sets the silence bound (2.5 intervals): a second
	// keeps a loaded machine's late heartbeat from ending a stream. The
	// deaf agent still sends one every 50 ms, twenty within the
	// UnansweredDialTimeout.
	const heartbeat = time.Second
	reg := prometheus.NewPedanticRegistry()
	// No backend dial timeout within the test: only the unanswered-dial
	// check can take a dial from the deaf agent before httpDial gives up.
	e := startEnv(t, server.Config{Registerer: reg, Heartbeat: heartbeat, UnansweredDialTimeout: time.Second, BackendDialTimeout: time.Hour})
	startAgent(t, e, agentOpts{id: "good"})
	deaf, err := connectAgent(t, e, agentOpts{id: "deaf", extraMD: heartbeatMD(heartbeat)})
	require.NoError(t, err)
	slow, err := connectAgent(t, e, agentOpts{id: "slow", extraMD: heartbeatMD(heartbeat)})
	require.NoError(t, err)
	waitBackends(t, e, 3)
	// The deaf agent heartbeats and reads nothing.
	ctx, stop := context.WithCancel(t.Context())
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for deaf.Send(wire.Heartbeat()) == nil {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stop(); <-beating }()
	// The slow agent reads, answers each dial with its progress at once
	// and with DIAL_RSP only after twice the UnansweredDialTimeout, and
	// answers the server's heartbeats.
	var slowTaken atomic.Int64 // DIAL_CLS the slow agent got: dials taken from it
	go func() {
		for {
			p, err := slow.Recv()
			if err != nil {
				return
			}
			switch p.GetType() {
			case client.PacketType_DIAL_CLS:
				slowTaken.Add(1)
			case client.PacketType_DIAL_REQ:
				r := p.GetDialRequest().GetRandom()
				if slow.Send(wire.DialProgressHeartbeat(r)) != nil {
					return
				}
				time.AfterFunc(2*time.Second, func() { _ = slow.Send(wire.DialRsp(r, r, "")) })
			case wire.PacketHeartbeat:
				_ = slow.Send(wire.Heartbeat())
			}
		}
	}()
	unresponsive := gaugeOf(reg, "servercount_server_unresponsive_agent_streams", nil)
	retried := gaugeOf(reg, "servercount_server_dial_retries_total", map[string]string{"reason": "unresponsive"})
	target := echoServer(t)

	// Rounds of dials, a third of which go to the deaf agent by chance,
	// until it has had one: every dial succeeds, the deaf agent's retried
	// on another agent within the UnansweredDialTimeout (before httpDial
	// gives up, after 20 s).
	for round := 0; unresponsive() == 0; round++ {
		require.Less(t, round, 10, "ten rounds of dials and the heartbeating deaf agent was never taken for unresponsive")
		require.Equal(t, 9, dialAll(t, e, target, 9), "dials failed beside a heartbeating deaf agent")
	}
	require.Positive(t, retried())
	assert.Zero(t, slowTaken.Load(), "dials taken from the slow agent, which showed its progress")
}
