package server

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/wire"
)

// heldStream is the send side of a stream whose Send waits until the test
// lets it go, and records what it sent: it holds the writer inside one
// Send, between two queueings, which no real stream does on demand. Only
// Send is called; the embedded interface is nil.
type heldStream struct {
	packetStream
	release chan struct{}
	mu      sync.Mutex
	sent    []client.PacketType
}

func (s *heldStream) Send(p *client.Packet) error {
	<-s.release
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, p.GetType())
	return nil
}

func (s *heldStream) got() []client.PacketType {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]client.PacketType(nil), s.sent...)
}

// testMetrics returns the server's metrics on a registry of their own.
func testMetrics(t *testing.T) *metrics {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	return m
}

// heldPeer returns a peer on a heldStream, with its metrics, whose writer
// has taken one DATA packet and waits inside Send until the test
// releases it. The test's end releases it and ends the peer.
func heldPeer(t *testing.T, segment string) (*peer, *heldStream, *metrics) {
	t.Helper()
	m := testMetrics(t)
	s := &heldStream{release: make(chan struct{})}
	p := newPeer(s, m, segment, clock.NewMonotonic(nil))
	t.Cleanup(func() {
		close(s.release)
		p.end(errPeerGone)
		p.stopWriter()
	})
	require.True(t, p.offer(wire.Data(1, []byte("held"))))
	require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.taken == 1 }, 10*time.Second, time.Millisecond, "the writer never took the first packet")
	return p, s, m
}

// TestControlPacketGoesBeforeLaterData queues, while the writer is inside
// a Send and nothing else is queued, a DIAL_RSP and then the tunnel's
// first DATA, as the receive loop and the tunnel's pump do: the DIAL_RSP
// goes first. Counting the queue from the writer's side let the DATA go
// first, and a frontend drops DATA for a connection it does not know yet.
func TestControlPacketGoesBeforeLaterData(t *testing.T) {
	p, s, _ := heldPeer(t, segmentToClient)
	require.True(t, p.sendTunnelControl(wire.DialRsp(7, 2, ""), 7))
	require.True(t, p.offer(wire.Data(2, []byte("first of the new tunnel"))))
	for range 3 {
		s.release <- struct{}{}
	}
	require.Eventually(t, func() bool { return len(s.got()) == 3 }, 10*time.Second, time.Millisecond, "sent %v", s.got())
	require.Equal(t, []client.PacketType{client.PacketType_DATA, client.PacketType_DIAL_RSP, client.PacketType_DATA}, s.got())
}

// TestTunnelControlIsBounded fills the control queue of a stream whose
// peer reads nothing with packets about its tunnels (sendTunnelControl),
// which maxControl does not count: the queue takes maxControl +
// maxTunnelControl of them, shown by the control_queued_packets gauge, and
// the next ends the stream for control backlog and empties the gauge. No
// stream of ours reaches that many (an agent holds at most its tunnel
// bound), so only this test shows the bound holds.
func TestTunnelControlIsBounded(t *testing.T) {
	// Nothing more leaves the queue.
	p, _, m := heldPeer(t, segmentToAgent)

	const bound = maxControl + maxTunnelControl
	for id := int64(1); id <= bound; id++ {
		require.True(t, p.sendTunnelControl(wire.CloseReq(id), id), "CLOSE_REQ %d of %d was not queued", id, bound)
	}
	require.Equal(t, float64(bound), testutil.ToFloat64(m.controlQueued))
	require.False(t, p.ended.Load(), "the stream ended within the bound")

	require.False(t, p.sendTunnelControl(wire.CloseReq(bound+1), bound+1), "a CLOSE_REQ past the bound was queued")
	require.True(t, p.ended.Load())
	require.ErrorIs(t, p.reason, errControlBacklog)
	require.Equal(t, 1.0, testutil.ToFloat64(m.streamsEnded.WithLabelValues(string(streamEndedControlBacklog))))
	require.Zero(t, testutil.ToFloat64(m.controlQueued), "the ended stream's packets are still counted as queued")
}

// An answer about a connection is queued once while one for it waits: a
// peer that repeats what it sends gets one answer, not one each. Once the
// waiting one is taken, a new one is queued (it may answer another
// request).
func TestControlAnswersAreQueuedOnce(t *testing.T) {
	p, s, m := heldPeer(t, segmentToAgent)
	for range 1000 {
		require.True(t, p.sendControl(wire.CloseReq(5), 5))
	}
	require.Equal(t, 1.0, testutil.ToFloat64(m.controlQueued))
	s.release <- struct{}{} // the held DATA
	s.release <- struct{}{} // the CLOSE_REQ
	require.Eventually(t, func() bool { return len(s.got()) == 2 }, 10*time.Second, time.Millisecond, "sent %v", s.got())
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.controlQueued) == 0 }, 10*time.Second, time.Millisecond)
	require.True(t, p.sendControl(wire.CloseReq(5), 5))
	s.release <- struct{}{}
	require.Eventually(t, func() bool { return len(s.got()) == 3 }, 10*time.Second, time.Millisecond, "an answer after the last was taken: sent %v", s.got())
	require.Equal(t, []client.PacketType{client.PacketType_DATA, client.PacketType_CLOSE_REQ, client.PacketType_CLOSE_REQ}, s.got())
}
