package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/servercounter"
)

// A serverCount header is whatever a peer sends: 1e9 must not become the
// target under any policy, TargetMax included (issue 10, item 5).
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
			srv := newTestServer(t, tt, serverOpts{id: "s1", count: "1000000000"})
			cfg := testConfig(tt, srv.addr)
			cfg.Counter = servercounter.StaticServerCounter(2)
			cfg.TargetPolicy = tc.policy
			cfg.ServerCountMax = tc.max
			a := startAgent(t, cfg)
			srv.nextStream(t)
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
