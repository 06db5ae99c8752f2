package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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

// Issue 10 item 6: a frontend's DATA packet of up to wire.MaxMessageSize
// (konnectivity-client sends each Write whole) was queued whole on the
// agent stream, so an agent that does not read made a queue of 32 packets
// hold up to 512 MiB. Now it is queued in pieces of MaxDataPayload: the
// queue holds at most QueueSize pieces plus the one being sent, and an
// agent that reads again gets every byte in order.
func TestAgentQueueBoundedInBytes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	bound := float64((server.QueueSize + 1) * wire.MaxDataPayload)
	var mu sync.Mutex
	highest := 0.0
	// Looked at from Eventually's goroutine too, where require must not
	// stop the test: the highest value seen is checked at the end.
	queued := func() float64 {
		v, _ := metricstest.Value(reg, "servercount_server_queued_bytes")
		mu.Lock()
		highest = max(highest, v)
		mu.Unlock()
		return v
	}
	waiting := func() float64 {
		v, _ := metricstest.Value(reg, "servercount_server_frontends_waiting_for_agent")
		return v
	}

	// The agent answers one dial, then does not read until the queue is
	// full.
	a, err := connectAgent(t, e, agentOpts{id: "slow"})
	require.NoError(t, err)
	t.Cleanup(func() { a.cancel(); a.cc.Close() })
	waitBackends(t, e, 1)

	cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := client.NewProxyServiceClient(cc).Proxy(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(wire.DialReq("tcp", "127.0.0.1:9", 7)))
	req, err := a.stream.Recv()
	require.NoError(t, err)
	a.send(wire.DialRsp(req.GetDialRequest().GetRandom(), 1, ""))
	rsp, err := stream.Recv()
	require.NoError(t, err)
	require.Empty(t, rsp.GetDialResponse().GetError())

	const (
		packetLen = 2 << 20 // under the test agent's 4 MiB receive limit
		packets   = 16
		total     = packetLen * packets
	)
	// Send blocks once the server stops receiving; it ends when the agent
	// has read everything or, if the test fails, when ctx is cancelled.
	sent := make(chan error, 1)
	go func() {
		for i := range packets {
			if err := stream.Send(wire.Data(1, streamBytes(i*packetLen, packetLen))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	// Full: the frontend's next piece waits for room in the agent's
	// queue, which holds QueueSize pieces.
	// Over the bound ends the wait at once, to fail below.
	require.Eventually(t, func() bool {
		q := queued()
		return q > bound || q >= float64(server.QueueSize*wire.MaxDataPayload) && waiting() == 1
	}, waitFor, 5*time.Millisecond, "the agent's queue never filled")
	checkBound := func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.LessOrEqual(t, highest, bound, "the agent's queue held more than (QueueSize+1) x MaxDataPayload bytes")
	}
	checkBound()

	// The agent reads: every byte arrives, in order, the gauge looked at
	// after each packet while the server refills the queue.
	got := make([]byte, 0, total)
	for len(got) < total {
		pkt, err := a.stream.Recv()
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

// The other way, issue 10 item 6: an agent's DATA packet of up to
// wire.MaxMessageSize was queued whole for its frontend, so an HTTP
// CONNECT client that does not read made a queue of 32 packets hold up to
// 512 MiB. Now it is queued in pieces: the tunnel's queue holds at most
// QueueSize pieces plus the one being written, and a client that reads
// again gets every byte in order.
func TestHTTPConnectQueueBoundedInBytes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	bound := float64((server.QueueSize + 1) * wire.MaxDataPayload)
	var mu sync.Mutex
	highest := 0.0
	queued := func() float64 {
		v, _ := metricstest.Value(reg, "servercount_server_queued_bytes")
		mu.Lock()
		highest = max(highest, v)
		mu.Unlock()
		return v
	}
	checkBound := func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.LessOrEqual(t, highest, bound, "the tunnel's queue held more than (QueueSize+1) x MaxDataPayload bytes")
	}

	a, err := connectAgent(t, e, agentOpts{id: "big-writer"})
	require.NoError(t, err)
	t.Cleanup(func() { a.cancel(); a.cc.Close() })
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
		req, err := a.stream.Recv()
		if err != nil {
			sent <- err
			return
		}
		a.sendMu.Lock()
		defer a.sendMu.Unlock()
		if err := a.stream.Send(wire.DialRsp(req.GetDialRequest().GetRandom(), 1, "")); err != nil {
			sent <- err
			return
		}
		for i := range packets {
			if err := a.stream.Send(wire.Data(1, streamBytes(i*packetLen, packetLen))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	c, br, code := connectVia(t, e, http.MethodConnect, "127.0.0.1:9")
	require.Equal(t, http.StatusOK, code)

	// The client does not read: the queue fills to its bound. Over the
	// bound ends the wait at once, to fail below.
	require.Eventually(t, func() bool {
		q := queued()
		return q > bound || q >= float64(server.QueueSize*wire.MaxDataPayload)
	}, waitFor, 5*time.Millisecond, "the tunnel's queue never filled")
	checkBound()

	// The client reads: every byte, in order, the gauge looked at after
	// each read while the server refills the queue.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitFor)))
	got := make([]byte, total)
	for off := 0; off < total; {
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
