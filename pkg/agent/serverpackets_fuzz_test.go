package agent

import (
	"bytes"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/wire"
)

// fuzzConnectID stands, in a fuzz input, for the connectID of the tunnel
// the target opens before sending the input's packets.
const fuzzConnectID = 1

// FuzzServerPackets sends a real agent whatever packets a proxy-server
// could send on its stream, after a tunnel to an echo endpoint is open
// (connectID 1 in the input stands for it). The agent must not panic; it
// must keep serving a well-behaved tunnel on the same stream or have
// closed the stream; and once the stream is ended, every tunnel and dial
// the packets opened must be closed. DIAL_REQs go only to loopback: an
// address other than the echo endpoint's or a refused one becomes the
// echo endpoint's. The server turns flow control on, so that WINDOW
// packets and DATA past the window are fuzzed too. One agent and one
// server serve every input.
func FuzzServerPackets(f *testing.F) {
	const id = fuzzConnectID
	for _, seed := range [][]*pb.Packet{
		{wire.Data(id, []byte("hello")), wire.CloseReq(id)},
		{wire.CloseReq(id), wire.CloseReq(id), wire.Data(id, []byte("late"))},
		{wire.DialReq("tcp", "127.0.0.1:1", 5), wire.DialReq("tcp", "127.0.0.1:1", 5), wire.DialCls(5)},
		{wire.DialReq("udp", "127.0.0.1:1", 6), wire.DialReq("unix", "/nonexistent", 7), wire.DialReq("tcp", "", 8)},
		{wire.Data(99, []byte("unknown")), wire.CloseReq(99), wire.DialRsp(1, 1, ""), wire.CloseRsp(1, "")},
		{wire.Drain(), wire.Data(id, bytes.Repeat([]byte("x"), 3*wire.MaxDataPayload))},
		{{Type: pb.PacketType_DATA}, {Type: pb.PacketType_DIAL_REQ}, {Type: pb.PacketType_CLOSE_REQ}, {Type: pb.PacketType(99)}},
		{{Type: pb.PacketType_DATA, Payload: &pb.Packet_CloseRequest{CloseRequest: &pb.CloseRequest{ConnectID: id}}}},
		{wire.DialReq("tcp", "127.0.0.1:1", 0), wire.DialReq("tcp", "127.0.0.1:1", -1), wire.Data(0, []byte("zero"))},
		{wire.WindowUpdate(id, 1<<20), wire.WindowUpdate(id, wire.MaxTunnelWindow), wire.WindowUpdate(99, 5), wire.Data(id, []byte("after credit"))},
		{{Type: wire.PacketWindow}, {Type: wire.PacketWindow, Payload: &pb.Packet_Data{Data: &pb.Data{ConnectID: id, Data: []byte{0xff, 0xff}}}}},
		{wire.Data(id, bytes.Repeat([]byte("o"), wire.MaxDataPayload)), wire.Data(id, bytes.Repeat([]byte("v"), wire.MaxDataPayload)), wire.Data(id, []byte("past the window"))},
	} {
		f.Add(adversarytest.EncodePackets(seed...))
	}

	tt := newTestTLS(f)
	srv := newTestServer(f, tt, adversarytest.ServerConfig{ID: "s1", Count: "1",
		Metadata: []string{wire.HeaderTunnelWindow, strconv.Itoa(wire.DefaultTunnelWindow)}})
	echo := newTestTarget(f, true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(f, err)
	refused := lis.Addr().String()
	require.NoError(f, lis.Close())
	cfg := testConfig(tt, srv.Addr())
	cfg.TunnelWindow = 2 * wire.MaxDataPayload // small: inputs can overrun it
	a := startAgent(f, cfg)
	var random int64 = 1 << 40 // the target's own dials; inputs use others

	f.Fuzz(func(t *testing.T, data []byte) {
		pkts := adversarytest.DecodePackets(data)
		st := srv.NextStream(t) // the last input ended the one before
		random++
		tunnel := dialThrough(t, st, echo.addr, random)
		for _, p := range pkts {
			fuzzSanitize(p, tunnel, echo.addr, refused)
			if st.SendPacket(p) != nil {
				break // the agent ended the stream
			}
		}
		// A well-behaved tunnel still works on the stream, unless the
		// agent has closed it.
		random++
		if !st.Ended() {
			if id := dialThrough(t, st, echo.addr, random); id != 0 {
				echoThrough(t, st, id)
			}
		}
		// The stream ends: every tunnel and dial of it is closed.
		st.End()
		require.Eventually(t, func() bool {
			conns, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
			queued, _ := a.metric(t, "servercount_agent_queued_bytes")
			return a.OpenTunnels() == 0 && conns == 0 && queued == 0
		}, waitFor, time.Millisecond, "tunnels or queued bytes left: %d tunnels", a.OpenTunnels())
	})
}

// fuzzSanitize makes p safe to send to an agent in a test: connectID
// fuzzConnectID becomes tunnel, and a DIAL_REQ may reach only echo or
// refused.
func fuzzSanitize(p *pb.Packet, tunnel int64, echo, refused string) {
	if d := p.GetData(); d != nil && d.ConnectID == fuzzConnectID {
		d.ConnectID = tunnel
	}
	if c := p.GetCloseRequest(); c != nil && c.ConnectID == fuzzConnectID {
		c.ConnectID = tunnel
	}
	if r := p.GetDialRequest(); r != nil && r.Address != "" && r.Address != echo && r.Address != refused {
		r.Address = echo
	}
}

// dialThrough opens a tunnel to address with random and returns its
// connectID, skipping the agent's other packets; 0 if the stream ended or
// the dial failed.
func dialThrough(t *testing.T, st *adversarytest.ServerStream, address string, random int64) int64 {
	t.Helper()
	if st.SendPacket(wire.DialReq("tcp", address, random)) != nil {
		return 0
	}
	for {
		p := nextOrEnd(t, st)
		if p == nil {
			return 0
		}
		if rsp := p.GetDialResponse(); p.GetType() == pb.PacketType_DIAL_RSP && rsp.GetRandom() == random {
			if rsp.GetError() != "" {
				t.Fatalf("dial to the echo endpoint failed: %s", rsp.GetError())
			}
			return rsp.GetConnectID()
		}
	}
}

// echoThrough sends a line through the tunnel id and waits for the echo,
// skipping the agent's other packets, unless the stream ends.
func echoThrough(t *testing.T, st *adversarytest.ServerStream, id int64) {
	t.Helper()
	msg := []byte("well-behaved")
	if st.SendPacket(wire.Data(id, msg)) != nil {
		return
	}
	var got []byte
	for len(got) < len(msg) {
		p := nextOrEnd(t, st)
		if p == nil {
			return
		}
		if d := p.GetData(); p.GetType() == pb.PacketType_DATA && d.GetConnectID() == id {
			got = append(got, d.GetData()...)
		}
		if c := p.GetCloseResponse(); p.GetType() == pb.PacketType_CLOSE_RSP && c.GetConnectID() == id {
			t.Fatalf("the agent closed the well-behaved tunnel: %v", c)
		}
	}
	require.Equal(t, msg, got)
}

// nextOrEnd returns the agent's next packet, or nil when the stream has
// ended; it fails the test after waitFor.
func nextOrEnd(t *testing.T, st *adversarytest.ServerStream) *pb.Packet {
	t.Helper()
	select {
	case p := <-st.Packets():
		return p
	case <-st.Done():
		return nil
	case <-time.After(waitFor):
		t.Fatal("the agent sent nothing and kept its stream")
		return nil
	}
}
