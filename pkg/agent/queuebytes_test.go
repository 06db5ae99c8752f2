package agent

import (
	"io"
	"sync"
	"testing"

	"github.com/servercount/servercount/internal/nettest"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/wire"
)

// A DATA packet of up to wire.MaxMessageSize was queued
// whole, so an endpoint that does not read made a tunnel's queue of 128
// packets hold up to 128 x 16 MiB. Now the queue is bounded in bytes
// (plainQueueBytes, for a server without flow control as here), and an
// endpoint that reads again gets every byte in order.
func TestTunnelQueueBoundedInBytes(t *testing.T) {
	a, st := oneStream(t)
	target := newTestTarget(t, false)
	id := st.DialOK(t, target.addr, 7)
	conn := target.accepted(t) // not read until the queue is full

	const (
		packetLen = 4 << 20
		packets   = 8 // 32 MiB: more than loopback socket buffers absorb
		total     = packetLen * packets
	)
	// The queue's bytes, those being written included, and one piece
	// counted while the receive loop waits for room for it.
	bound := float64(plainQueueBytes + wire.MaxDataPayload)
	// The sender blocks once the agent stops reading its stream; it ends
	// when the data is read or, if the test fails, when the agent stops.
	sent := make(chan error, 1)
	go func() {
		for i := range packets {
			if err := st.SendPacket(wire.Data(id, nettest.Pattern(i*packetLen, packetLen))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()

	// Eventually runs its condition in another goroutine, where require
	// must not stop the test: the highest value seen is checked after.
	var mu sync.Mutex
	highest := 0.0
	queued := func() float64 {
		v, _ := a.metric(t, "servercount_agent_queued_bytes")
		mu.Lock()
		highest = max(highest, v)
		mu.Unlock()
		return v
	}
	// Full: the endpoint does not read, so the queue fills up to its
	// bound and no further; every look checks the bound.
	require.Eventually(t, func() bool { return queued() >= float64(plainQueueBytes) }, waitFor, tick)

	_, ok := a.metric(t, "servercount_agent_queued_bytes")
	require.True(t, ok, "servercount_agent_queued_bytes is not exported")

	// The endpoint reads: every byte arrives, in order. The gauge is
	// looked at after each read too, while the agent refills the queue.
	got := make([]byte, total)
	for off := 0; off < total; {
		n, err := io.ReadAtLeast(conn, got[off:], 1)
		require.NoError(t, err)
		off += n
		queued()
	}
	require.Equal(t, nettest.Pattern(0, total), got, "bytes lost or out of order")
	require.NoError(t, <-sent)
	require.Eventually(t, func() bool { return queued() == 0 }, waitFor, tick)
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, highest, bound, "a tunnel queue held more than plainQueueBytes + MaxDataPayload bytes")
}
