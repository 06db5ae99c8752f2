package agent

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/wire"
)

// oneStream starts a server and an agent and returns the agent's stream.
func oneStream(t testing.TB) (*testAgent, *adversarytest.ServerStream) {
	t.Helper()
	return oneStreamWith(t, func(*Config) {})
}

// oneStreamWith is oneStream with an agent whose testConfig set changes.
func oneStreamWith(t testing.TB, set func(*Config)) (*testAgent, *adversarytest.ServerStream) {
	t.Helper()
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	cfg := testConfig(tt, srv.Addr())
	set(&cfg)
	a := startAgent(t, cfg)
	return a, srv.NextStream(t)
}

func TestTunnelRoundTrip(t *testing.T) {
	a, st := oneStream(t)
	target := newTestTarget(t, false)

	id := st.DialOK(t, target.addr, 42)
	assert.Equal(t, int64(1), id, "connectIDs start at 1")
	conn := target.accepted(t)
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
	assert.Equal(t, 1.0, v)

	// Server to endpoint.
	st.Send(t, wire.Data(id, []byte("hello ")))
	st.Send(t, wire.Data(id, []byte("endpoint")))
	got := make([]byte, len("hello endpoint"))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err := io.ReadFull(conn, got)
	require.NoError(t, err)
	assert.Equal(t, "hello endpoint", string(got))

	// Endpoint to server.
	_, err = conn.Write([]byte("hello server"))
	require.NoError(t, err)
	var back []byte
	for len(back) < len("hello server") {
		d := st.NextOf(t, pb.PacketType_DATA).GetData()
		assert.Equal(t, id, d.GetConnectID())
		back = append(back, d.GetData()...)
	}
	assert.Equal(t, "hello server", string(back))

	// The next tunnel gets the next ID.
	assert.Equal(t, int64(2), st.DialOK(t, target.addr, 43))
}

func TestTunnelDialErrors(t *testing.T) {
	refused := func(t *testing.T) string { return nettest.Refused(t, "127.0.0.1") }
	tests := []struct {
		name    string
		address func(t *testing.T) string
	}{
		{name: "refused port", address: refused},
		// An invalid host name fails in the (pinned, see main_test.go) Go
		// resolver without a query: tests send nothing off loopback, so a
		// real unresolvable name such as nonexistent.invalid, which would
		// go to the host's nameserver, is not used.
		{name: "unresolvable host", address: func(*testing.T) string { return "bad host:80" }},
		{name: "no port", address: func(*testing.T) string { return "127.0.0.1" }},
	}
	a, st := oneStream(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			random := int64(100 + i)
			start := time.Now()
			st.Send(t, wire.DialReq("tcp", tc.address(t), random))
			rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
			assert.Less(t, time.Since(start), 2*time.Second, "longer than DialTimeout")
			assert.NotEmpty(t, rsp.GetError())
			assert.Equal(t, random, rsp.GetRandom())
			assert.Zero(t, rsp.GetConnectID())
		})
	}
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason", "unknown")
	assert.Equal(t, float64(len(tests)), v)

	t.Run("unsupported protocol", func(t *testing.T) {
		st.Send(t, wire.DialReq("unix", "/run/x.sock", 9))
		rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
		assert.Contains(t, rsp.GetError(), "unsupported protocol")
	})
}

func TestTunnelCloseRequest(t *testing.T) {
	a, st := oneStream(t)
	target := newTestTarget(t, false)
	id := st.DialOK(t, target.addr, 1)
	conn := target.accepted(t)

	// Data sent before CLOSE_REQ still reaches the endpoint.
	st.Send(t, wire.Data(id, []byte("last words")))
	st.Send(t, wire.CloseReq(id))
	rsp := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
	assert.Equal(t, id, rsp.GetConnectID())
	assert.Empty(t, rsp.GetError())

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	got, err := io.ReadAll(conn)
	require.NoError(t, err, "the endpoint connection was not closed")
	assert.Equal(t, "last words", string(got))
	require.Eventually(t, func() bool {
		v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
		return v == 0
	}, waitFor, tick)

	// The connectID is gone now.
	st.Send(t, wire.Data(id, []byte("late")))
	rsp = st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
	assert.Equal(t, id, rsp.GetConnectID())
	assert.NotEmpty(t, rsp.GetError())
}

func TestTunnelEndpointCloses(t *testing.T) {
	_, st := oneStream(t)
	target := newTestTarget(t, false)
	id := st.DialOK(t, target.addr, 1)
	conn := target.accepted(t)

	_, err := conn.Write([]byte("bye"))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	var got []byte
	for {
		p := st.Next(t)
		if p.GetType() == pb.PacketType_CLOSE_RSP {
			assert.Equal(t, id, p.GetCloseResponse().GetConnectID())
			assert.Empty(t, p.GetCloseResponse().GetError())
			break
		}
		require.Equal(t, pb.PacketType_DATA, p.GetType())
		got = append(got, p.GetData().GetData()...)
	}
	assert.Equal(t, "bye", string(got))

	// One CLOSE_RSP only: the next packet answers the next request.
	st.Send(t, wire.CloseReq(id))
	rsp := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
	assert.Equal(t, id, rsp.GetConnectID())
	assert.NotEmpty(t, rsp.GetError(), "a second CLOSE_RSP for the closed tunnel")
}

func TestTunnelUnknownConnectID(t *testing.T) {
	tests := []struct {
		name string
		pkt  *pb.Packet
	}{
		{name: "DATA", pkt: wire.Data(999, []byte("x"))},
		{name: "CLOSE_REQ", pkt: wire.CloseReq(999)},
	}
	_, st := oneStream(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st.Send(t, tc.pkt)
			rsp := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
			assert.Equal(t, int64(999), rsp.GetConnectID())
			assert.Equal(t, errUnknownConnectID, rsp.GetError())
		})
	}
	t.Run("DIAL_CLS is ignored", func(t *testing.T) {
		st.Send(t, wire.DialCls(5))
		st.Send(t, wire.CloseReq(998))
		assert.Equal(t, int64(998), st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse().GetConnectID())
	})
}

func TestTunnelsConcurrent(t *testing.T) {
	const (
		tunnels = 200
		size    = 64 << 10
		chunk   = 8 << 10
	)
	a, st := oneStream(t)
	target := newTestTarget(t, true)

	for i := range tunnels {
		st.Send(t, wire.DialReq("tcp", target.addr, int64(i+1)))
	}
	ids := map[int64]int{} // connectID -> tunnel index
	for range tunnels {
		rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
		require.Empty(t, rsp.GetError())
		ids[rsp.GetConnectID()] = int(rsp.GetRandom() - 1)
	}
	require.Len(t, ids, tunnels, "connectIDs not distinct")

	rng := rand.New(rand.NewPCG(1, 2))
	payloads := make([][]byte, tunnels)
	for i := range payloads {
		payloads[i] = make([]byte, size)
		for j := range payloads[i] {
			payloads[i][j] = byte(rng.IntN(256))
		}
	}
	// Send from one goroutine per tunnel while the test reads the echoes.
	sendErr := make(chan error, tunnels)
	for id, i := range ids {
		go func() {
			for off := 0; off < size; off += chunk {
				err := st.SendPacket(wire.Data(id, payloads[i][off:off+chunk]))
				if err != nil {
					sendErr <- err
					return
				}
			}
			sendErr <- nil
		}()
	}
	got := make(map[int64][]byte, tunnels)
	complete := 0
	for complete < tunnels {
		d := st.NextOf(t, pb.PacketType_DATA).GetData()
		id := d.GetConnectID()
		_, ok := ids[id]
		require.True(t, ok, "DATA for connectID %d", id)
		got[id] = append(got[id], d.GetData()...)
		require.LessOrEqual(t, len(got[id]), size)
		if len(got[id]) == size {
			complete++
		}
	}
	for range tunnels {
		require.NoError(t, <-sendErr)
	}
	for id, i := range ids {
		require.True(t, bytes.Equal(payloads[i], got[id]), "tunnel %d (connectID %d) corrupted", i, id)
	}
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
	assert.Equal(t, float64(tunnels), v)

	for id := range ids {
		st.Send(t, wire.CloseReq(id))
	}
	for range tunnels {
		rsp := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
		require.Empty(t, rsp.GetError(), fmt.Sprint(rsp))
	}
	require.Eventually(t, func() bool {
		v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
		return v == 0
	}, waitFor, tick)
}

// A stream that ends closes its tunnels and is dropped.
func TestStreamEndClosesTunnels(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	target := newTestTarget(t, false)
	a := startAgent(t, testConfig(tt, srv.Addr()))
	st := srv.NextStream(t)
	st.DialOK(t, target.addr, 1)
	conn := target.accepted(t)
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)

	srv.Stop()
	require.Eventually(t, func() bool { return a.Connected() == 0 }, waitFor, tick)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err := conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
}

// A server that turns flow control on and then sends more than the
// agent's window for a tunnel whose endpoint does not read loses that
// tunnel (CLOSE_RSP), and the agent's receive loop never waits for the
// endpoint: DATA for another tunnel of the stream still arrives.
func TestServerOverrunningTheWindowLosesTheTunnel(t *testing.T) {
	const window = 64 << 10
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1",
		Metadata: []string{wire.HeaderTunnelWindow, strconv.Itoa(window)}})
	cfg := testConfig(tt, srv.Addr())
	cfg.TunnelWindow = window
	cfg.EndpointWriteTimeout = time.Hour // the tunnel must end for its overrun, not a timeout
	a := startAgent(t, cfg)
	st := srv.NextStream(t)
	assert.Equal(t, []string{strconv.Itoa(window)}, st.Metadata().Get(wire.HeaderTunnelWindow), "the agent did not offer its window")

	deaf := newTestTarget(t, false)
	deafID := st.DialOK(t, deaf.addr, 1)
	deaf.accepted(t) // never read
	echo := newTestTarget(t, true)
	echoID := st.DialOK(t, echo.addr, 2)

	// Up to the window, and past what the endpoint's socket takes.
	chunk := make([]byte, window/4)
	for sent := 0; sent < 64*window; sent += len(chunk) {
		st.Send(t, wire.Data(deafID, chunk))
	}
	// The tunnel ends with a CLOSE_RSP; the DATA sent after it is
	// answered as for any unknown connectID.
	st.Send(t, wire.Data(echoID, []byte("still here")))
	closed := false
	for {
		p := st.Next(t)
		if p.GetType() == pb.PacketType_CLOSE_RSP && p.GetCloseResponse().GetConnectID() == deafID {
			closed = true
		}
		if p.GetType() == pb.PacketType_DATA && p.GetData().GetConnectID() == echoID {
			assert.Equal(t, "still here", string(p.GetData().GetData()))
			break
		}
	}
	assert.True(t, closed, "the overrun tunnel was not closed before the echo came back")
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
	assert.Equal(t, 1.0, v, "the overrun tunnel's endpoint connection is still open")
}

// An idle tunnel holds one goroutine, its reader: the writer runs only
// while there is data for the endpoint, and goes once it is written.
func TestIdleTunnelHoldsOneGoroutine(t *testing.T) {
	_, st := oneStream(t)
	target := newTestTarget(t, true)
	const n = 50
	ids := make([]int64, n)
	for i := range n {
		ids[i] = st.DialOK(t, target.addr, int64(i+1))
	}
	const (
		reader = "github.com/servercount/servercount/pkg/agent.(*tunnel).readLoop"
		writer = "github.com/servercount/servercount/pkg/agent.(*tunnel).writeLoop"
	)
	// The package's tests run one at a time: these are all the tunnels.
	require.Eventually(t, func() bool { return metricstest.GoroutinesIn(reader) == n && metricstest.GoroutinesIn(writer) == 0 }, waitFor, tick,
		"%d readers and %d writers for %d idle tunnels", metricstest.GoroutinesIn(reader), metricstest.GoroutinesIn(writer), n)

	// Data for one tunnel: a writer writes it, the target echoes it back,
	// and the writer goes.
	st.Send(t, wire.Data(ids[7], []byte("ping")))
	d := st.NextOf(t, pb.PacketType_DATA).GetData()
	assert.Equal(t, ids[7], d.GetConnectID())
	assert.Equal(t, "ping", string(d.GetData()))
	require.Eventually(t, func() bool { return metricstest.GoroutinesIn(writer) == 0 }, waitFor, tick, "the writer stayed after its data was written")

	// CLOSE_REQ with nothing queued: a writer starts only to finish the
	// tunnel.
	st.Send(t, wire.CloseReq(ids[3]))
	assert.Equal(t, ids[3], st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse().GetConnectID())
}
