package server

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

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

// TestControlPacketGoesBeforeLaterData queues, while the writer is inside
// a Send and nothing else is queued, a DIAL_RSP and then the tunnel's
// first DATA, as the receive loop and the tunnel's pump do: the DIAL_RSP
// goes first. Counting the queue from the writer's side let the DATA go
// first, and a frontend drops DATA for a connection it does not know yet.
func TestControlPacketGoesBeforeLaterData(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	s := &heldStream{release: make(chan struct{})}
	p := newPeer(s, m, segmentToClient)
	defer func() {
		close(s.release)
		p.end(errPeerGone)
		p.stopWriter()
	}()

	require.True(t, p.offer(wire.Data(1, []byte("earlier tunnel"))))
	require.Eventually(t, func() bool { return p.dequeued.Load() == 1 }, 10*time.Second, time.Millisecond, "the writer never took the first packet")
	require.True(t, p.sendTunnelControl(wire.DialRsp(7, 2, ""), 7))
	require.True(t, p.offer(wire.Data(2, []byte("first of the new tunnel"))))
	for range 3 {
		s.release <- struct{}{}
	}
	require.Eventually(t, func() bool { return len(s.got()) == 3 }, 10*time.Second, time.Millisecond, "sent %v", s.got())
	require.Equal(t, []client.PacketType{client.PacketType_DATA, client.PacketType_DIAL_RSP, client.PacketType_DATA}, s.got())
}
