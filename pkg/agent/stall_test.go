package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/wire"
)

// The liveness backstop: a server stream on which nothing moves
// while the agent has packets to send (a server that stopped reading) is
// ended within StreamStallTimeout, logged at level 0 and counted, and the
// agent dials the server again.
func TestStalledServerStreamIsEndedAndRedialled(t *testing.T) {
	const stall = 300 * time.Millisecond
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1", Deaf: true})
	cfg := testConfig(tt, srv.Addr())
	cfg.StreamStallTimeout = stall
	a, logs := runLogged(t, cfg)
	_, stopTarget := stickStream(t, srv)
	require.Eventually(t, func() bool {
		v, _ := a.metric(t, "servercount_agent_streams_ended_total", "reason", "stalled")
		return v >= 1 && srv.Opened() >= 2
	}, waitFor, tick, "the stalled stream was not ended and dialled again")
	assert.Contains(t, logs.String(), "Ended a proxy-server stream on which nothing moved while packets waited")
	stopTarget()

	// The new stream is idle: nothing waits on it, so it stays.
	opened := srv.Opened()
	assert.Never(t, func() bool { return srv.Opened() != opened }, 8*stall, stall/4, "an idle stream was ended")
	assert.Equal(t, 1, strings.Count(logs.String(), "Ended a proxy-server stream on which nothing moved"), "a stream was ended more than once")
}

// stickStream gets the agent's next stream to srv, a server that reads
// nothing, stuck: srv asks for a tunnel to a target that never stops
// talking, so the agent's DATA fills the stream's window and its Send
// waits. stopTarget closes the target's connection and waits until it
// has stopped writing; it also runs when the test ends.
func stickStream(t *testing.T, srv *adversarytest.HostileServer) (ss *adversarytest.ServerStream, stopTarget func()) {
	t.Helper()
	target := newTestTarget(t, false)
	ss = srv.NextStream(t)
	ss.Send(t, wire.DialReq("tcp", target.addr, 1))
	c := target.accepted(t)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		_ = nettest.WriteUntilFailed(c)
	}()
	// Closing twice is harmless, and a closed writerDone does not block.
	stopTarget = func() {
		c.Close()
		<-writerDone
	}
	t.Cleanup(stopTarget)
	return ss, stopTarget
}

// stuck reports whether one of a's streams has had a send waiting with
// nothing moving on it for d.
func (a *testAgent) stuck(d time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.clients {
		if c.senders.Load() > 0 && c.stalled(d) {
			return true
		}
	}
	return false
}

// The agent answers without waiting, so a server that stops
// reading can make it queue answers; the queue is bounded. Answers to the
// same connectID wait in the queue once (besides the one being sent),
// and past the bound the stream is ended (and counted), freeing the
// queue.
func TestControlQueueIsBounded(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1", Deaf: true})
	cfg := testConfig(tt, srv.Addr())
	cfg.StreamStallTimeout = -1 // the bound, not the backstop, must end it
	a, logs := runLogged(t, cfg)
	queued := func() float64 { v, _ := a.metric(t, "servercount_agent_control_queued_packets"); return v }
	ss, _ := stickStream(t, srv)
	// Every answer must wait in the queue, so the burst starts only once
	// the stream is stuck: an answer sent before would never reach the
	// bound (on a loaded machine the stream takes a while to fill).
	require.Eventually(t, func() bool { return a.stuck(200 * time.Millisecond) }, waitFor, tick, "the stream did not get stuck")
	// DATA for unknown connections: each is answered with CLOSE_RSP,
	// which waits in the queue. The first answer is taken and its send
	// waits; the same ID a thousand times more is one answer more.
	ss.Send(t, wire.Data(1<<40, []byte("x")))
	waitSending(t, onlyClient(t, a))
	for range 1000 {
		ss.Send(t, wire.Data(1<<40, []byte("x")))
	}
	require.Eventually(t, func() bool { return queued() == 2 }, waitFor, tick)
	for id := int64(1); id < maxControl-1; id++ {
		ss.Send(t, wire.Data(1<<40+id, []byte("x")))
	}
	require.Eventually(t, func() bool { return queued() == maxControl }, waitFor, tick)
	v, _ := a.metric(t, "servercount_agent_streams_ended_total", "reason", "control_backlog")
	require.Equal(t, float64(0), v, "the stream was ended before its queue passed the bound")

	ss.Send(t, wire.Data(1<<41, []byte("x")))
	require.Eventually(t, func() bool {
		v, _ := a.metric(t, "servercount_agent_streams_ended_total", "reason", "control_backlog")
		return v == 1 && queued() == 0 && srv.Opened() >= 2
	}, waitFor, tick, "the stream over its answer bound was not ended")
	assert.Contains(t, logs.String(), "Ended a proxy-server stream whose server left too many answers unread")
}

// The answer bound counts only what no tunnel of the stream accounts for:
// a server that closes more tunnels at once than that bound (its
// frontends gone with kube-apiserver) while the link back is slow gets a
// CLOSE_RSP queued for each, and the stream stays. They all arrive once
// the server reads again. The server closes as many tunnels as the
// default bound lets a stream hold, above the answer bound (the stream
// holds one more, whose endpoint keeps it stuck).
func TestClosingEveryTunnelAtOnceKeepsTheStream(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	cfg := testConfig(tt, srv.Addr())
	cfg.StreamStallTimeout = -1 // the bound, not the backstop, is under test
	const n = DefaultMaxTunnelsPerServer
	require.Greater(t, n, maxControl)
	cfg.MaxConcurrentDials = n // all dialled at once
	cfg.MaxTunnelsPerServer = n + 1
	a, _ := runLogged(t, cfg)
	queued := func() float64 { v, _ := a.metric(t, "servercount_agent_control_queued_packets"); return v }
	backlog := func() float64 {
		v, _ := a.metric(t, "servercount_agent_streams_ended_total", "reason", "control_backlog")
		return v
	}

	// n idle tunnels, then one more whose endpoint writes until the
	// stream to the server, which stops reading, is stuck.
	idle := nettest.Hold(t)
	ss := srv.NextStream(t)
	ss.FloodDialReqs(t, idle, n)
	for range n {
		require.Empty(t, ss.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse().GetError())
	}
	writer := newTestTarget(t, false)
	ss.Send(t, wire.DialReq("tcp", writer.addr, n+1))
	c := writer.accepted(t)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		_ = nettest.WriteUntilFailed(c)
	}()
	defer func() { c.Close(); <-writerDone }()
	// Filling the windows and buffers on the way takes seconds under
	// the race detector, many more on a loaded machine.
	require.Eventually(t, func() bool { return a.stuck(200 * time.Millisecond) }, 4*waitFor, tick, "the stream did not get stuck")

	// connectIDs are 1 to n: the server closes them all. A writer that a
	// loaded machine held up for the 200 ms, not the full windows, may
	// send a few CLOSE_RSPs before it is stuck for good: more than the
	// answer bound must wait in the queue, and the stream must stay.
	for id := int64(1); id <= n; id++ {
		ss.Send(t, wire.CloseReq(id))
	}
	require.Eventually(t, func() bool { return queued() > maxControl }, 4*waitFor, tick, "the CLOSE_RSPs were not queued")
	require.Equal(t, float64(0), backlog(), "the stream was ended for closing its own tunnels")
	require.Equal(t, int64(1), srv.Opened())

	// The endpoint stops and the server reads again: every CLOSE_RSP
	// arrives on the same stream.
	c.Close()
	<-writerDone
	closed := map[int64]bool{}
	for len(closed) < n {
		p := ss.Next(t)
		if p.GetType() == pb.PacketType_CLOSE_RSP && p.GetCloseResponse().GetConnectID() <= n {
			closed[p.GetCloseResponse().GetConnectID()] = true
		}
	}
	require.Eventually(t, func() bool { return queued() == 0 }, waitFor, tick)
	require.Equal(t, float64(0), backlog())
	require.Equal(t, int64(1), srv.Opened())
}

// A server that shuts down gracefully sends DRAIN; the agent
// keeps that stream (its tunnels finish), no longer counts it, and
// connects to another server at once.
func TestServerDrainMakesTheAgentSeekAnother(t *testing.T) {
	tt := newTestTLS(t)
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	s2 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s2", Count: "1"})
	lb := newTestLB(t, s1.Addr())
	cfg := testConfig(tt, lb.Addr())
	cfg.SyncInterval, cfg.SyncIntervalCap = time.Hour, time.Hour // only the DRAIN may wake it
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
	ss := s1.NextStream(t)

	lb.SetBackends(s2.Addr()) // s1 has stopped listening
	ss.Send(t, wire.Drain())
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick, "no second server after the first one's DRAIN")
	assert.False(t, ss.Ended(), "the draining server's stream was closed")
	assert.Equal(t, 1, a.serving())
}
