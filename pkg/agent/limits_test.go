package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// A serverCount header is whatever a peer sends: 1e9 must not become the
// target under any policy, TargetMax included.
func TestReceivedCountClampedByServerCountMax(t *testing.T) {
	tests := []struct {
		name   string
		policy TargetPolicy
		max    int
		want   int
	}{
		{name: "received", policy: TargetReceived, max: 3, want: 3},
		{name: "max", policy: TargetMax, max: 3, want: 3},
		{name: "counted ignores it", policy: TargetCounted, max: 3, want: 2},
		{name: "default cap", policy: TargetMax, want: DefaultServerCountMax},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTLS(t)
			srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1000000000"})
			cfg := testConfig(tt, srv.Addr())
			cfg.Counter = servercounter.StaticServerCounter(2)
			cfg.TargetPolicy = tc.policy
			cfg.ServerCountMax = tc.max
			a := startAgent(t, cfg)
			srv.NextStream(t)
			require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
			assert.Equal(t, tc.want, a.Target())
			v, _ := a.metric(t, "konnectivity_network_proxy_agent_known_server_count")
			assert.Equal(t, float64(tc.want), v)
		})
	}
}

// The Counter's count is capped as well: a static count or a Counter
// without a clamp of its own cannot exceed ServerCountMax either.
func TestCountedCountClampedByServerCountMax(t *testing.T) {
	p := &targetPolicy{policy: TargetCounted, window: 3, maxCount: 4, now: time.Now}
	n, _ := p.target(servercounter.Result{Count: 1 << 40, Source: servercounter.SourceStatic})
	assert.Equal(t, 4, n)
}

// A server stream holds at most MaxTunnelsPerServer tunnels: a DIAL_REQ
// over it is answered at once with a DIAL_RSP error and no dial (issue
// 10, item 4), and a closed tunnel frees its slot.
func TestDialReqOverTunnelLimitIsRefused(t *testing.T) {
	a, st := oneStreamWith(t, func(cfg *Config) { cfg.MaxTunnelsPerServer = 2 })
	target := newTestTarget(t, false)

	first := st.DialOK(t, target.addr, 1)
	target.accepted(t)
	st.DialOK(t, target.addr, 2)
	target.accepted(t)
	v, _ := a.metric(t, "servercount_agent_busiest_server_tunnels")
	assert.Equal(t, 2.0, v)

	st.Send(t, wire.DialReq("tcp", target.addr, 3))
	rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
	assert.Equal(t, int64(3), rsp.GetRandom())
	assert.Zero(t, rsp.GetConnectID())
	assert.Contains(t, rsp.GetError(), "--max-tunnels-per-server")
	v, _ = a.metric(t, "konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason", "tunnel_limit")
	assert.Equal(t, 1.0, v)
	v, _ = a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
	assert.Equal(t, 2.0, v, "the refused DIAL_REQ opened no connection")

	// Closing a tunnel frees its slot for the next dial.
	st.Send(t, wire.CloseReq(first))
	assert.Equal(t, first, st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse().GetConnectID())
	require.Eventually(t, func() bool { return a.OpenTunnels() == 1 }, waitFor, tick)
	st.DialOK(t, target.addr, 4)
	target.accepted(t)
	assert.Equal(t, 2, a.OpenTunnels())
}

// At most MaxConcurrentDials endpoint dials are in flight: one more
// DIAL_REQ is refused at once, without waiting for the hung dials.
func TestDialReqOverConcurrentDialLimitIsRefused(t *testing.T) {
	hang := nettest.Blackhole(t)
	a, st := oneStreamWith(t, func(cfg *Config) {
		cfg.MaxConcurrentDials = 2
		cfg.DialTimeout = time.Minute // the hung dials end with the stream, at cleanup
	})

	st.Send(t, wire.DialReq("tcp", hang, 1))
	st.Send(t, wire.DialReq("tcp", hang, 2))
	require.Eventually(t, func() bool {
		v, _ := a.metric(t, "servercount_agent_endpoint_dials_in_flight")
		return v == 2
	}, waitFor, tick)

	target := newTestTarget(t, false)
	st.Send(t, wire.DialReq("tcp", target.addr, 3))
	rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
	assert.Equal(t, int64(3), rsp.GetRandom(), "the refusal comes before the hung dials' answers")
	assert.Zero(t, rsp.GetConnectID())
	assert.Contains(t, rsp.GetError(), "--max-concurrent-dials")
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason", "dial_limit")
	assert.Equal(t, 1.0, v)
	assert.Equal(t, 2, a.OpenTunnels(), "the refused dial holds no slot")
}

// A server flooding DIAL_REQs to an address whose connects hang, as a
// hostile server once did, gets MaxConcurrentDials dials
// and a refusal for every other request, each answered at once.
func TestDialReqFloodIsBounded(t *testing.T) {
	const maxDials, flood = 8, 500
	hang := nettest.Blackhole(t)
	a, st := oneStreamWith(t, func(cfg *Config) {
		cfg.MaxConcurrentDials = maxDials
		cfg.DialTimeout = time.Minute // the hung dials end with the stream, at cleanup
	})

	st.FloodDialReqs(t, hang, flood)
	for range flood - maxDials {
		rsp := st.NextOf(t, pb.PacketType_DIAL_RSP).GetDialResponse()
		require.Contains(t, rsp.GetError(), "--max-concurrent-dials")
	}
	v, _ := a.metric(t, "servercount_agent_endpoint_dials_in_flight")
	assert.Equal(t, float64(maxDials), v)
	v, _ = a.metric(t, "konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason", "dial_limit")
	assert.Equal(t, float64(flood-maxDials), v)
	assert.Equal(t, maxDials, a.OpenTunnels())
}
