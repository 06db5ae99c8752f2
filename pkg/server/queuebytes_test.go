package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// streamBytes returns n bytes of a stream starting at offset off, such
// that a byte out of order or lost shows.
func streamBytes(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) % 251)
	}
	return b
}

// sendStream sends the first packets x packetLen bytes of streamBytes on
// connectID 1, a DATA packet of packetLen bytes at a time, until send
// fails.
func sendStream(send func(*client.Packet) error, packets, packetLen int) error {
	for i := range packets {
		if err := send(wire.Data(1, streamBytes(i*packetLen, packetLen))); err != nil {
			return err
		}
	}
	return nil
}

// A frontend's DATA packet of up to wire.MaxMessageSize
// (konnectivity-client sends each Write whole) was queued whole on the
// agent stream, so an agent that does not read made a queue of 32 packets
// hold up to 512 MiB. Now it is queued in pieces of MaxDataPayload: the
// queue holds at most QueueSize pieces plus the one being sent, and an
// agent that reads again gets every byte in order.
func TestAgentQueueBoundedInBytes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	queued, checkBound := queuedBytesWatch(t, reg)
	waiting := gaugeOf(reg, "servercount_server_frontends_waiting_for_agent", nil)

	// The agent answers one dial, then does not read until the queue is
	// full.
	a, stream := tunnelThroughAgent(t, t.Context(), e, "slow")

	const (
		packetLen = 2 << 20 // under the test agent's 4 MiB receive limit
		packets   = 16
		total     = packetLen * packets
	)
	// Send blocks once the server stops receiving; it ends when the agent
	// has read everything or, if the test fails, when ctx is cancelled.
	sent := make(chan error, 1)
	go func() { sent <- sendStream(stream.Send, packets, packetLen) }()
	// Full: the frontend's next piece waits for room in the agent's
	// queue, which holds QueueSize pieces.
	// Over the bound ends the wait at once, to fail below.
	require.Eventually(t, func() bool {
		q := queued()
		return q > queueBound || q >= float64(server.QueueSize*wire.MaxDataPayload) && waiting() == 1
	}, waitFor, 5*time.Millisecond, "the agent's queue never filled")
	checkBound()

	// The agent reads: every byte arrives, in order, the gauge looked at
	// after each packet while the server refills the queue.
	got := make([]byte, 0, total)
	for len(got) < total {
		pkt, err := a.Recv()
		require.NoError(t, err)
		require.Equal(t, client.PacketType_DATA, pkt.GetType())
		require.LessOrEqual(t, len(pkt.GetData().GetData()), wire.MaxDataPayload)
		got = append(got, pkt.GetData().GetData()...)
		queued()
	}
	require.Equal(t, streamBytes(0, total), got, "bytes lost or out of order")
	require.NoError(t, <-sent)
	require.Eventually(t, func() bool { return queued() == 0 }, waitFor, 5*time.Millisecond)
	checkBound()
}

// The other way: an agent's DATA packet of up to
// wire.MaxMessageSize was queued whole for its frontend, so an HTTP
// CONNECT client that does not read made a queue of 32 packets hold up to
// 512 MiB. Now it is queued in pieces: the tunnel's queue holds at most
// QueueSize pieces plus the one being written, and a client that reads
// again gets every byte in order.
func TestHTTPConnectQueueBoundedInBytes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	queued, checkBound := queuedBytesWatch(t, reg)

	a, err := connectAgent(t, e, agentOpts{id: "big-writer"})
	require.NoError(t, err)
	waitBackends(t, e, 1)

	const (
		packetLen = 4 << 20
		packets   = 8 // 32 MiB: more than loopback socket buffers absorb
		total     = packetLen * packets
	)
	// The agent answers the dial and sends; Send blocks once the server
	// stops receiving, and fails when the agent is cancelled.
	sent := make(chan error, 1)
	go func() {
		if _, err := a.AcceptDial(1); err != nil {
			sent <- err
			return
		}
		sent <- sendStream(a.Send, packets, packetLen)
	}()
	c, br, code := connectVia(t, e, http.MethodConnect, "127.0.0.1:9")
	require.Equal(t, http.StatusOK, code)

	// The client does not read: the queue fills to its bound. Over the
	// bound ends the wait at once, to fail below.
	require.Eventually(t, func() bool {
		q := queued()
		return q > queueBound || q >= float64(server.QueueSize*wire.MaxDataPayload)
	}, waitFor, 5*time.Millisecond, "the tunnel's queue never filled")
	checkBound()

	// The client reads: every byte, in order, the gauge looked at after
	// each read while the server refills the queue. The deadline bounds a
	// stall, not the whole transfer: 32 MiB under the race detector on a
	// loaded machine took more than waitFor.
	got := make([]byte, total)
	for off := 0; off < total; {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(waitFor)))
		n, err := br.Read(got[off:])
		require.NoError(t, err)
		off += n
		queued()
	}
	require.Equal(t, streamBytes(0, total), got, "bytes lost or out of order")
	require.NoError(t, <-sent)
	require.Eventually(t, func() bool { return queued() == 0 }, waitFor, 5*time.Millisecond)
	checkBound()
}
