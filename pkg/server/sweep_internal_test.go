package server

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/wire"
)

// TestSweepChecksEachStreamWhenDue runs sweep rounds at chosen times over
// two idle streams, one with heartbeats and one without, and shows that a
// round visits only the streams whose checks could act, and that each
// check still acts at the first round after its time: the heartbeat after
// the server's interval, the end of a silent agent after the silence
// limit, and the end of a receive loop stuck in one packet after the
// stall timeout, though the rounds before visited nothing.
func TestSweepChecksEachStreamWhenDue(t *testing.T) {
	m := testMetrics(t)
	s := &liveness{mu: new(sync.Mutex), cfg: Config{Heartbeat: 5 * time.Second, StreamStallTimeout: 30 * time.Second}, metrics: m, log: klog.Background(),
		mono: clock.NewMonotonic(nil), logs: new(logLimiter), dials: new(pendingDials)}
	stream := func() (*peer, *heldStream) {
		hs := &heldStream{release: make(chan struct{})}
		close(hs.release) // Send does not wait
		p := newPeer(hs, m, segmentToAgent, s.mono)
		t.Cleanup(func() {
			p.end(errPeerGone)
			p.stopWriter()
		})
		return p, hs
	}
	quietPeer, _ := stream()
	quiet := &agentStream{peer: quietPeer}
	beatingPeer, beatingStream := stream()
	beating := &agentStream{peer: beatingPeer, peerHeartbeat: 5 * time.Second}
	s.swept.add(quiet)
	s.swept.add(beating)

	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// The receive loops wait from t0 on.
	quietPeer.waiting.Store(s.mono.Of(t0))
	beatingPeer.waiting.Store(s.mono.Of(t0))

	var sw sweeper
	round := func(d time.Duration) int {
		s.sweep(at(d), &sw, true)
		return sw.checked
	}
	heartbeats := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(beatingStream.got()) == n }, 10*time.Second, time.Millisecond,
			"sent %v, want %d HEARTBEATs", beatingStream.got(), n)
		for _, typ := range beatingStream.got() {
			require.Equal(t, wire.PacketHeartbeat, typ, "the heartbeat stream sent something else")
		}
	}

	require.Equal(t, 2, round(0), "a new stream is due at once")
	require.Equal(t, 0, round(time.Second), "nothing is due a second later")
	require.Equal(t, 0, round(4*time.Second))
	require.Equal(t, 1, round(5*time.Second), "the heartbeat is due after the server's interval")
	heartbeats(1)
	require.Equal(t, 0, round(6*time.Second))
	require.Equal(t, 0, round(9*time.Second))
	require.Equal(t, 1, round(10*time.Second), "the next heartbeat is due an interval after the last")
	heartbeats(2)
	require.Equal(t, 0, round(12*time.Second))
	require.False(t, beatingPeer.ended.Load())
	require.Equal(t, 1, round(13*time.Second), "the silence limit, 12.5 s after the loop began to wait, is due")
	require.True(t, beatingPeer.ended.Load(), "an agent silent past the silence limit was not ended")

	require.Equal(t, 0, round(29*time.Second), "the ended stream is never due again, the quiet one not before the stall timeout")
	require.Equal(t, 1, round(30*time.Second), "the quiet stream is due once a stall timeout has passed")
	// Its receive loop begins a packet at 31 s and never finishes it.
	quietPeer.waiting.Store(0)
	quietPeer.handling.Store(s.mono.Of(at(31 * time.Second)))
	require.Equal(t, 0, round(59*time.Second))
	require.Equal(t, 1, round(60*time.Second), "the quiet stream is due a stall timeout after its last check")
	require.False(t, quietPeer.ended.Load(), "a loop inside a packet for 29 s was taken for stuck")
	require.Equal(t, 1, round(61*time.Second), "a stuck loop is due a stall timeout after it began its packet")
	require.True(t, quietPeer.ended.Load(), "a loop stuck in one packet for the stall timeout was not ended")
}

// TestSweepListKeepsEachStreamsPlace removes streams from the middle and
// the end of the sweep's list: each stream left keeps its own due time
// and finds itself at its index.
func TestSweepListKeepsEachStreamsPlace(t *testing.T) {
	var l sweepList
	bes := make([]*agentStream, 4)
	for i := range bes {
		bes[i] = &agentStream{}
		l.add(bes[i])
		l.setDue(bes[i], int64(100*(i+1)))
	}
	check := func(want ...*agentStream) {
		t.Helper()
		require.ElementsMatch(t, want, l.streams)
		require.Len(t, l.due, len(want))
		for _, be := range want {
			require.Same(t, be, l.streams[be.sweepIndex])
			require.Equal(t, int64(100*(slices.Index(bes, be)+1)), l.due[be.sweepIndex], "the due time of stream %d", slices.Index(bes, be))
		}
	}
	l.remove(bes[1])
	bes[1].gone = true
	check(bes[0], bes[2], bes[3])
	l.setDue(bes[1], 1) // gone: changes nothing
	check(bes[0], bes[2], bes[3])
	l.remove(bes[3])
	check(bes[0], bes[2])
	require.Equal(t, []*agentStream{bes[0]}, l.appendDue(nil, 100))
	l.remove(bes[0])
	l.remove(bes[2])
	check()
}

// TestSweepEndsAStalledWriterWhenDue holds a stream's writer inside one
// Send: the stream is due a stall timeout after the writer started, not
// after the round that first saw it, and is ended then.
func TestSweepEndsAStalledWriterWhenDue(t *testing.T) {
	p, _, m := heldPeer(t, segmentToAgent)
	t0 := time.Now() // after the writer started
	s := &liveness{mu: new(sync.Mutex), cfg: Config{StreamStallTimeout: 30 * time.Second}, metrics: m, log: klog.Background(),
		mono: p.mono, logs: new(logLimiter), dials: new(pendingDials)}
	be := &agentStream{peer: p}
	s.swept.add(be)
	var sw sweeper
	round := func(d time.Duration) int {
		s.sweep(t0.Add(d), &sw, true)
		return sw.checked
	}
	require.Equal(t, 1, round(10*time.Second))
	require.False(t, p.ended.Load(), "a writer inside one Send for 10 s was taken for stalled")
	require.Equal(t, 0, round(29*time.Second))
	require.Equal(t, 1, round(30*time.Second), "the stream is due a stall timeout after its writer started")
	require.True(t, p.ended.Load(), "a writer stalled for the stall timeout was not ended")
}
