package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/pkg/servercounter"
)

func TestNewClientSetValidates(t *testing.T) {
	valid := func() Config {
		cfg := DefaultConfig()
		cfg.AgentID = "a"
		cfg.ServerAddress = "127.0.0.1:8091"
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		return cfg
	}
	tests := []struct {
		name     string
		mutate   func(*Config)
		wantErrs []string
	}{
		{name: "valid", mutate: func(*Config) {}},
		{name: "zero durations take defaults", mutate: func(c *Config) {
			c.SyncInterval, c.SyncIntervalCap, c.ProbeInterval, c.DialTimeout, c.HandshakeTimeout = 0, 0, 0, 0, 0
		}},
		{name: "insecure without dial options", mutate: func(c *Config) { c.DialOptions, c.Insecure = nil, true }},
		{name: "missing agent ID", mutate: func(c *Config) { c.AgentID = "" }, wantErrs: []string{"AgentID"}},
		{name: "missing address", mutate: func(c *Config) { c.ServerAddress = "" }, wantErrs: []string{"ServerAddress"}},
		{name: "address without port", mutate: func(c *Config) { c.ServerAddress = "proxy" }, wantErrs: []string{"ServerAddress"}},
		{name: "no credentials", mutate: func(c *Config) { c.DialOptions = nil }, wantErrs: []string{"DialOptions", "Insecure"}},
		{name: "flow control off", mutate: func(c *Config) { c.TunnelWindow = -1 }},
		{name: "tunnel window out of range", mutate: func(c *Config) { c.TunnelWindow = -2 },
			wantErrs: []string{"TunnelWindow -2: want 1 to 1073741824 bytes, or -1 for no flow control (0 means the default)"}},
		{name: "negative probe interval", mutate: func(c *Config) { c.ProbeInterval = -time.Second }, wantErrs: []string{"ProbeInterval"}},
		{name: "cap below interval", mutate: func(c *Config) { c.SyncInterval, c.SyncIntervalCap = 5*time.Second, time.Second }, wantErrs: []string{"SyncIntervalCap"}},
		{name: "negative bounds", mutate: func(c *Config) { c.ServerCountMax, c.MaxConcurrentDials, c.MaxTunnelsPerServer = -1, -1, -1 },
			wantErrs: []string{"ServerCountMax", "MaxConcurrentDials", "MaxTunnelsPerServer"}},
		{name: "every problem at once", mutate: func(c *Config) {
			c.AgentID, c.ServerAddress, c.DialOptions, c.DialTimeout = "", "", nil, -1
		}, wantErrs: []string{"AgentID", "ServerAddress", "DialOptions", "DialTimeout"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.mutate(&cfg)
			cs, err := NewClientSet(cfg)
			if len(tc.wantErrs) == 0 {
				require.NoError(t, err)
				require.NotNil(t, cs)
				return
			}
			require.Error(t, err)
			for _, want := range tc.wantErrs {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	cfg := DefaultConfig()
	assert.Equal(t, TargetReceived, cfg.TargetPolicy, "upstream's policy")
	assert.Equal(t, DialLoadBalancer, cfg.DialMode)
	assert.Equal(t, time.Second, cfg.SyncInterval)
	assert.Equal(t, 10*time.Second, cfg.SyncIntervalCap)
	assert.Equal(t, time.Second, cfg.ProbeInterval)
	assert.Equal(t, 5*time.Second, cfg.DialTimeout)
	assert.Equal(t, servercounter.StaticServerCounter(1), cfg.Counter)
	assert.Equal(t, DefaultServerCountMax, cfg.ServerCountMax)
	assert.Equal(t, DefaultMaxConcurrentDials, cfg.MaxConcurrentDials)
	assert.Equal(t, DefaultMaxTunnelsPerServer, cfg.MaxTunnelsPerServer)
}

func TestMetricsExistFromStart(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AgentID, cfg.ServerAddress, cfg.Insecure = "a", "127.0.0.1:1", true
	cfg.Counter = servercounter.StaticServerCounter(4)
	a := newAgent(t, cfg)

	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{name: "konnectivity_network_proxy_agent_open_server_connections", want: 0},
		{name: "konnectivity_network_proxy_agent_open_endpoint_connections", want: 0},
		{name: "konnectivity_network_proxy_agent_known_server_count", want: 4},
		{name: "servercount_agent_target_server_count", labels: []string{"source", "static"}, want: 4},
		{name: "servercount_agent_server_dials_total", labels: []string{"result", "duplicate"}, want: 0},
		{name: "servercount_agent_endpoint_dials_in_flight", want: 0},
		{name: "servercount_agent_busiest_server_tunnels", want: 0},
		{name: "servercount_agent_queued_bytes", want: 0},
	} {
		got, ok := a.metric(t, tc.name, tc.labels...)
		assert.True(t, ok, "%s%v missing", tc.name, tc.labels)
		assert.Equal(t, tc.want, got, "%s%v", tc.name, tc.labels)
	}
	// Upstream's labelled series appear when they first happen: a tool
	// that compares the exposition with upstream's sees no extra zero.
	_, ok := a.metric(t, "konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason", "timeout")
	assert.False(t, ok, "no endpoint_dial_failure_total series before a failure")

	// A second ClientSet on the same registry is refused, clearly.
	cfg.Registerer = a.reg
	_, err := NewClientSet(cfg)
	require.ErrorContains(t, err, "register agent metrics")
}

func newPolicy(policy TargetPolicy, now func() time.Time) *targetPolicy {
	return &targetPolicy{policy: policy, window: 3, holdDown: 30 * time.Second, now: now}
}

func TestTargetPolicy(t *testing.T) {
	tests := []struct {
		name       string
		counter    int
		policy     TargetPolicy
		received   []int
		wantCount  int
		wantSource string
	}{
		{name: "counter before any server", counter: 3, policy: TargetReceived, wantCount: 3, wantSource: "static"},
		{name: "received overwrites counter", counter: 3, policy: TargetReceived, received: []int{5}, wantCount: 5, wantSource: "received"},
		{name: "largest received in the window", counter: 1, policy: TargetReceived, received: []int{3, 5, 3}, wantCount: 5, wantSource: "received"},
		{name: "window forgets old counts", counter: 1, policy: TargetReceived, received: []int{9, 3, 3, 3}, wantCount: 3, wantSource: "received"},
		{name: "received ignored", counter: 3, policy: TargetCounted, received: []int{5}, wantCount: 3, wantSource: "static"},
		{name: "max takes received when larger", counter: 3, policy: TargetMax, received: []int{5}, wantCount: 5, wantSource: "received"},
		{name: "max takes counter when larger", counter: 6, policy: TargetMax, received: []int{5}, wantCount: 6, wantSource: "static"},
		{name: "max before any server", counter: 2, policy: TargetMax, wantCount: 2, wantSource: "static"},
		{name: "received zero is at least one", counter: 3, policy: TargetReceived, received: []int{0}, wantCount: 1, wantSource: "received"},
		{name: "counter zero is at least one", counter: 0, policy: TargetCounted, wantCount: 1, wantSource: "static"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(tc.policy, time.Now)
			for _, n := range tc.received {
				p.observeReceived(n)
			}
			res, err := servercounter.StaticServerCounter(tc.counter).Count(t.Context())
			require.NoError(t, err)
			n, src := p.target(res)
			assert.Equal(t, tc.wantCount, n)
			assert.Equal(t, tc.wantSource, src)
		})
	}
}

// Reading the target (ClientSet.Target) changes nothing: however long
// and often it is read while the count is lower, the hold-down starts only
// when the sync loop sees the lower count. (Before, each read moved the
// hold-down on.)
func TestPeekChangesNothing(t *testing.T) {
	now := time.Unix(0, 0)
	p := newPolicy(TargetCounted, func() time.Time { return now })
	count := func(n int) servercounter.Result { return servercounter.Result{Count: n} }
	n, _ := p.target(count(5))
	require.Equal(t, 5, n)
	for range 3 {
		assert.Equal(t, 5, p.peek(count(2)), "a decrease is held down")
		now = now.Add(time.Minute)
	}
	n, _ = p.target(count(2))
	assert.Equal(t, 5, n, "the hold-down starts when the sync loop sees 2, not at the first read")
	now = now.Add(29 * time.Second)
	assert.Equal(t, 5, p.peek(count(2)))
	now = now.Add(time.Second)
	assert.Equal(t, 2, p.peek(count(2)), "a read sees the hold-down end")
	n, _ = p.target(count(2))
	assert.Equal(t, 2, n)
}

func TestTargetPolicyString(t *testing.T) {
	assert.Equal(t, "received", TargetReceived.String())
	assert.Equal(t, "counted", TargetCounted.String())
	assert.Equal(t, "max", TargetMax.String())
	assert.Equal(t, "TargetPolicy(9)", TargetPolicy(9).String())
}

func TestTargetPolicyHoldsDecreases(t *testing.T) {
	clk := clocktest.New(time.Unix(1000, 0))
	p := newPolicy(TargetCounted, clk.Now)
	step := func(d time.Duration, count, want int) {
		t.Helper()
		clk.Step(d)
		got, _ := p.target(servercounter.Result{Count: count, Source: servercounter.SourceDNS})
		assert.Equal(t, want, got, "at +%v with count %d", d, count)
	}
	step(0, 6, 6)
	step(time.Second, 9, 9)    // increases apply at once
	step(time.Second, 0, 9)    // a single empty answer changes nothing
	step(10*time.Second, 2, 9) // still within the hold-down
	step(10*time.Second, 4, 9) // the largest lower count is remembered
	step(10*time.Second, 3, 4) // held 30s: drop to the largest seen
	step(time.Second, 4, 4)    // back at the target
	step(time.Second, 2, 4)    // a new hold starts
	step(10*time.Second, 5, 5) // an increase ends it
	step(40*time.Second, 5, 5) // steady
	step(time.Second, 0, 5)    // NXDOMAIN during a rollout...
	step(time.Second, 5, 5)    // ...for a moment: never reached 0
	step(31*time.Second, 0, 5) // a new hold starts
	step(31*time.Second, 0, 1) // held: the target floors at 1
}

// The metrics are registered on the Registerer and nowhere else.
func TestNilRegistererRegistersNothing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AgentID, cfg.ServerAddress, cfg.Insecure = "a", "127.0.0.1:1", true
	_, err := NewClientSet(cfg)
	require.NoError(t, err)
	_, err = NewClientSet(cfg) // would fail if the first had registered globally
	require.NoError(t, err)
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		assert.NotContains(t, mf.GetName(), "proxy_agent")
	}
}
