package adversarytest_test

import (
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/wire"
)

func TestPacketsRoundTrip(t *testing.T) {
	pkts := []*client.Packet{
		wire.DialReq("tcp", "127.0.0.1:80", 7),
		wire.DialRsp(7, 1, ""),
		wire.Data(1, []byte("hello")),
		wire.CloseReq(1),
		{Type: client.PacketType_DATA}, // no payload
		wire.Drain(),
	}
	got := adversarytest.DecodePackets(adversarytest.EncodePackets(pkts...))
	require.Len(t, got, len(pkts))
	for i := range pkts {
		assert.True(t, proto.Equal(pkts[i], got[i]), "packet %d: got %v, want %v", i, got[i], pkts[i])
	}
}

func TestDecodePacketsTakesAnyBytes(t *testing.T) {
	for _, data := range [][]byte{nil, {0}, {0xff}, {0x80, 0x80, 0x80}, {5, 1, 2}, make([]byte, 10000)} {
		assert.LessOrEqual(t, len(adversarytest.DecodePackets(data)), adversarytest.MaxDecodedPackets)
	}
}

// A deaf agent handshakes with a hostile server, which hears its headers
// and answers with the ones it was told to; the agent answers a dial and
// reads nothing else.
func TestDeafAgentMeetsHostileServer(t *testing.T) {
	srv := adversarytest.StartHostileServer(t, adversarytest.ServerConfig{ID: "liar", NewIDPerStream: true, Count: "1000000000"})
	for i, want := range []string{"liar-1", "liar-2"} {
		a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: srv.Addr(), ID: "deaf", Identifiers: "host=n1", Token: "tok"})
		require.NoError(t, err)
		defer a.Close()
		assert.Equal(t, []string{want}, a.Header().Get(wire.HeaderServerID), "stream %d", i)
		assert.Equal(t, []string{"1000000000"}, a.Header().Get(wire.HeaderServerCount))

		st := srv.NextStream(t)
		assert.Equal(t, want, st.ServerID())
		assert.Equal(t, []string{"deaf"}, st.Metadata().Get(wire.HeaderAgentID))
		assert.Equal(t, []string{"Bearer tok"}, st.Metadata().Get(wire.HeaderAuthorization))

		st.FloodDialReqs(t, "127.0.0.1:9", 3)
		req, err := a.AcceptDial(42)
		require.NoError(t, err)
		assert.Equal(t, int64(1), req.GetRandom())
		rest, err := a.RecvN(2)
		require.NoError(t, err)
		assert.Equal(t, int64(3), rest[1].GetDialRequest().GetRandom())
		rsp := st.NextOf(t, client.PacketType_DIAL_RSP).GetDialResponse()
		assert.Equal(t, int64(42), rsp.GetConnectID())
		a.Close()
		select {
		case <-st.Done():
		case <-time.After(adversarytest.Wait):
			t.Fatal("the stream did not end when the agent closed")
		}
	}
	assert.Equal(t, int64(2), srv.Opened())
}

// A refused handshake is the server's status, not a stream.
func TestDeafAgentRefused(t *testing.T) {
	srv := adversarytest.StartHostileServer(t, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	srv.Stop()
	_, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: srv.Addr(), ID: "a"})
	require.Error(t, err)
}

// LyingDNS claims what it is told, and flaps only when flipped.
func TestLyingDNS(t *testing.T) {
	const name = "_agent._tcp.proxy.test.svc."
	l := adversarytest.StartLyingDNS(t)
	count := func() int {
		c := &dns.Client{Net: "tcp", Timeout: adversarytest.Wait}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeSRV)
		r, _, err := c.Exchange(m, l.Addr())
		require.NoError(t, err)
		n := 0
		for _, rr := range r.Answer {
			if _, ok := rr.(*dns.SRV); ok {
				n++
			}
		}
		return n
	}
	l.Claim(name, 50, "127.0.0.1:1")
	assert.Equal(t, 50, count())

	l.Flap(name, []int{1, 40})
	assert.Equal(t, 1, count())
	assert.Equal(t, 1, count(), "no flip, no change")
	assert.Equal(t, 1, l.Flip())
	assert.Equal(t, 40, count())
	assert.Equal(t, 0, l.Flip())
	assert.Equal(t, 1, count())

	// Distinct records, on loopback.
	rrs := adversarytest.ClaimRecords(name, 70000)
	seen := map[string]bool{}
	for _, rr := range rrs {
		if a, ok := rr.(*dns.A); ok {
			assert.True(t, a.A.IsLoopback())
			assert.False(t, seen[a.A.String()], "duplicate %v", a.A)
			seen[a.A.String()] = true
		}
	}
	assert.Len(t, seen, 70000)
}
