package proxytest

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

// Scenario tests: proxy-servers on distinct loopback addresses behind a
// random load balancer, an in-process DNS server serving their SRV
// records, and an agent counting them through DNS (or, for comparison,
// one that only trusts the counts servers send), while the fleet scales
// and rolls.

// srvName is the SRV name of the proxy-servers' headless Service.
const srvName = "_agent._tcp.proxy.test.svc.cluster.local."

// More metric names read by the scenarios.
const (
	metricAgentRounds    = "servercount_agent_sync_rounds_total"
	metricAgentTarget    = "servercount_agent_target_server_count"
	metricAgentKnown     = "konnectivity_network_proxy_agent_known_server_count"
	metricAgentOpenConns = "konnectivity_network_proxy_agent_open_server_connections"
)

// fleet is a set of proxy-servers, the load balancer in front of them and
// the DNS server that lists them.
type fleet struct {
	t       testing.TB
	env     *Env
	dns     *dnstest.Server
	lb      *balancertest.Balancer
	servers []*Server // every server started, in order
}

func newFleet(t testing.TB) *fleet {
	t.Helper()
	lb, err := balancertest.New()
	require.NoError(t, err, "start load balancer")
	t.Cleanup(func() { _ = lb.Close() }) // the listener's close error is of no use
	return &fleet{t: t, env: NewEnv(t, "scenario-ca"), dns: dnstest.NewServer(t), lb: lb}
}

// start starts n servers, each on its own loopback address, reporting
// count (nil: the harness default), and returns them. They are neither in
// DNS nor behind the load balancer until publish.
func (f *fleet) start(n int, count func() servercounter.ServerCounter) []*Server {
	f.t.Helper()
	var out []*Server
	for range n {
		i := len(f.servers)
		opts := ServerOptions{ID: fmt.Sprintf("server-%d", i), Addr: fmt.Sprintf("127.0.0.%d:0", 10+i)}
		if count != nil {
			opts.Count = count()
		}
		s := StartServer(f.t, f.env, opts)
		f.servers = append(f.servers, s)
		out = append(out, s)
	}
	return out
}

// publish makes servers the load balancer's backends and DNS's records,
// the only ones.
func (f *fleet) publish(servers ...*Server) {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.AgentAddr()
	}
	f.lb.SetBackends(addrs...)
	f.dns.SetRecords(dnstest.SRVRecords(srvName, addrs...)...)
}

// dnsAgent starts an agent counting f's servers through DNS in mode, with
// edit (if not nil) applied to its configuration, and returns it with its
// counter, built with counterEdit.
func (f *fleet) dnsAgent(mode agent.DialMode, edit func(*agent.Config), counterEdit ...func(*servercounter.Config)) (*Agent, *servercounter.CachedServerCounter) {
	f.t.Helper()
	cache := DNSCounter(f.t, f.dns.Addr(), srvName, counterEdit...)
	cfg := DNSAgentConfigFor("agent-1", f.lb.Addr(), cache, mode)
	if edit != nil {
		edit(&cfg)
	}
	return StartAgent(f.t, f.env, cfg), cache
}

// converge publishes servers, starts an agent as dnsAgent does and waits
// until it holds them all.
func (f *fleet) converge(servers []*Server, mode agent.DialMode, edit func(*agent.Config)) (*Agent, *servercounter.CachedServerCounter) {
	f.t.Helper()
	f.publish(servers...)
	a, cache := f.dnsAgent(mode, edit)
	waitHolding(f.t, a, len(servers))
	return a, cache
}

// upstreamAgent starts an agent as upstream's behaves: no count source but
// the serverCount headers it receives, through the load balancertest.
func (f *fleet) upstreamAgent(edit func(*agent.Config)) *Agent {
	f.t.Helper()
	cfg := FastAgentConfig("agent-1", f.lb.Addr())
	cfg.SyncIntervalCap = 200 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	return StartAgent(f.t, f.env, cfg)
}

// agentState is what a scenario reads of an agent.
type agentState struct{ a *Agent }

func (s agentState) connected() int { return s.a.ClientSet().Connected() }

// target reads the target the sync loop last exported, without computing
// a new one.
func (s agentState) target(t testing.TB) int {
	return int(metric(t, s.a.Registry(), metricAgentKnown))
}

func (s agentState) dials(t testing.TB, result string) int {
	return int(metric(t, s.a.Registry(), metricAgentDials, "result", result))
}

// source returns the label of the target's source.
func (s agentState) source(t testing.TB) string {
	mfs, err := s.a.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == metricAgentTarget && len(mf.GetMetric()) > 0 {
			for _, l := range mf.GetMetric()[0].GetLabel() {
				if l.GetName() == "source" {
					return l.GetValue()
				}
			}
		}
	}
	return ""
}

func (s agentState) allDials(t testing.TB) int {
	return s.dials(t, "ok") + s.dials(t, "duplicate") + s.dials(t, "error")
}

func (s agentState) rounds(t testing.TB) int {
	return int(metric(t, s.a.Registry(), metricAgentRounds))
}

// waitHolding waits until the agent is connected to n servers and aims
// for n.
func waitHolding(t testing.TB, a *Agent, n int) {
	t.Helper()
	st := agentState{a}
	if !assert.Eventually(t, func() bool { return st.connected() == n && st.target(t) == n }, waitFor, tick) {
		require.FailNowf(t, "agent never held servers", "want %d, connected %d, target %d (source %s); dials ok %d, duplicate %d, error %d",
			n, st.connected(), st.target(t), st.source(t), st.dials(t, "ok"), st.dials(t, "duplicate"), st.dials(t, "error"))
	}
}

// waitRounds waits for n more sync rounds of the agent, calling sample (if
// not nil) at every poll.
func waitRounds(t testing.TB, a *Agent, n int, sample func()) {
	t.Helper()
	st := agentState{a}
	until := st.rounds(t) + n
	require.Eventually(t, func() bool {
		if sample != nil {
			sample()
		}
		return st.rounds(t) >= until
	}, waitFor, tick, "the agent did not do %d sync rounds", n)
}

// waitCount waits until the cache counts n (from DNS).
func waitCount(t testing.TB, cache *servercounter.CachedServerCounter, n int, sample func()) {
	t.Helper()
	require.Eventually(t, func() bool {
		if sample != nil {
			sample()
		}
		res, err := cache.Count(t.Context())
		return err == nil && res.Count == n && res.Source == servercounter.SourceDNS
	}, waitFor, tick, "the DNS counter never counted %d", n)
}

// deadAddr returns a host:port on host whose connects are refused for
// the whole test.
func deadAddr(t testing.TB, host string) string {
	t.Helper()
	return nettest.Refused(t, host)
}

var dialModes = []agent.DialMode{agent.DialLoadBalancer, agent.DialResolved}

func TestScenarioScaleUp(t *testing.T) {
	for _, mode := range dialModes {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			servers := f.start(6, nil)
			a, _ := f.converge(servers[:3], mode, nil)

			f.publish(servers...)
			waitHolding(t, a, 6)
			for _, s := range servers {
				assert.True(t, s.Core().Ready(), "server %s has no agent", s.ID())
			}
			st := agentState{a}
			assert.Equal(t, 6.0, metric(t, a.Registry(), metricAgentTarget, "source", "dns"), "target source")
			t.Logf("mode %s: dials ok=%d duplicate=%d error=%d", mode, st.dials(t, "ok"), st.dials(t, "duplicate"), st.dials(t, "error"))
			if mode == agent.DialResolved {
				assert.Equal(t, 6, st.dials(t, "ok"), "ok dials: N servers take N dials")
				assert.Zero(t, st.dials(t, "duplicate"), "duplicate dials")
				assert.Zero(t, st.dials(t, "error"), "failed dials")
			}
		})
	}
}

func TestScenarioScaleDown(t *testing.T) {
	const holdDown = 500 * time.Millisecond
	for _, mode := range dialModes {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			servers := f.start(6, nil)
			a, cache := f.converge(servers, mode, func(cfg *agent.Config) { cfg.HoldDown = holdDown })

			t0 := time.Now()
			f.publish(servers[:2]...)
			for _, s := range servers[2:] {
				s.Stop()
			}
			waitCount(t, cache, 2, nil)
			// The agent has seen 2 at most since the DNS change: the
			// hold-down keeps the target.
			assert.Equal(t, 6, a.ClientSet().Target(), "target right after DNS dropped to 2")

			st := agentState{a}
			require.Eventually(t, func() bool { return st.connected() == 2 }, waitFor, tick, "connections to stopped servers never dropped")
			require.Eventually(t, func() bool { return st.target(t) == 2 }, waitFor, tick, "target never dropped to 2")
			assert.GreaterOrEqual(t, time.Since(t0), holdDown, "the target dropped before the hold-down")
			assert.Equal(t, 2.0, metric(t, a.Registry(), metricAgentOpenConns))
		})
	}
}

func TestScenarioRollingUpdateStaleCounts(t *testing.T) {
	oldCount := func() servercounter.ServerCounter { return servercounter.StaticServerCounter(3) }
	newCount := func() servercounter.ServerCounter { return servercounter.StaticServerCounter(4) }

	t.Run("dns agent follows DNS", func(t *testing.T) {
		f := newFleet(t)
		old := f.start(3, oldCount)
		a, _ := f.converge(old, agent.DialLoadBalancer, nil)

		// Surge: a new server joins, DNS says 4 from here on, while old
		// servers still report 3.
		st := agentState{a}
		minTarget := math.MaxInt
		sample := func() { minTarget = min(minTarget, st.target(t)) }
		next := f.start(1, newCount)
		f.publish(append(old[:3:3], next...)...)
		waitHolding(t, a, 4)
		minTarget = math.MaxInt
		live := append(old[:3:3], next...)
		// Replace the old servers one at a time.
		for range 3 {
			gone := live[0]
			next := f.start(1, newCount)
			live = append(live[1:], next...)
			f.publish(live...)
			gone.Stop()
			require.Eventually(t, func() bool {
				sample()
				return st.connected() == 4 && next[0].Core().Ready()
			}, waitFor, tick, "agent never reached the new server %s", next[0].ID())
		}
		sample()
		assert.Equal(t, 4, minTarget, "the target left DNS's 4 during the rollout")
		assert.Equal(t, 4.0, metric(t, a.Registry(), metricAgentTarget, "source", "dns"))
	})

	tests := []struct {
		name   string
		window int // ReceivedWindow; 0 is the default
		// holdDown is the agent's; 0 is the default (30 s).
		holdDown time.Duration
		// want is the target after the agent connected to a new server,
		// then to an old one.
		want int
	}{
		{name: "upstream agent keeps the largest received", want: 4},
		// Upstream's behaviour: the last received count, at once.
		{name: "window of one and no hold-down takes the last", window: 1, holdDown: -1, want: 3},
		// The hold-down alone keeps the larger count for its duration.
		{name: "window of one with the hold-down keeps the largest", window: 1, want: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t)
			old := f.start(3, oldCount)
			next := f.start(1, newCount)
			f.lb.SetBackends(next[0].AgentAddr())
			a := f.upstreamAgent(func(cfg *agent.Config) { cfg.ReceivedWindow, cfg.HoldDown = tt.window, tt.holdDown })
			st := agentState{a}
			require.Eventually(t, func() bool { return st.connected() == 1 && st.target(t) == 4 }, waitFor, tick,
				"agent never took the new server's count 4 (connected %d, target %d)", st.connected(), st.target(t))

			// The balancer now sends the agent to an old server, which
			// reports 3.
			f.lb.SetBackends(old[0].AgentAddr())
			require.Eventually(t, func() bool { return st.connected() == 2 }, waitFor, tick, "agent never reached the old server")
			assert.Equal(t, tt.want, a.ClientSet().Target(), "target after an old server reported 3")
			assert.Equal(t, float64(tt.want), metric(t, a.Registry(), metricAgentTarget, "source", "received"))
			if tt.want == 4 {
				// Once every server is reachable the agent holds all 4.
				f.lb.SetBackends(append([]string{next[0].AgentAddr()}, old[0].AgentAddr(), old[1].AgentAddr(), old[2].AgentAddr())...)
				waitHolding(t, a, 4)
			}
		})
	}
}

func TestScenarioDNSOutage(t *testing.T) {
	tests := []struct {
		name  string
		fault dnstest.Fault
		mode  agent.DialMode
	}{
		{name: "servfail lb", fault: dnstest.Fault{Kind: dnstest.FaultServFail}, mode: agent.DialLoadBalancer},
		{name: "servfail resolved", fault: dnstest.Fault{Kind: dnstest.FaultServFail}, mode: agent.DialResolved},
		{name: "drop resolved", fault: dnstest.Fault{Kind: dnstest.FaultDrop}, mode: agent.DialResolved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t)
			servers := f.start(3, nil)
			a, _ := f.converge(servers, tt.mode, nil)
			st := agentState{a}
			dials := st.allDials(t)

			f.dns.SetFault(tt.fault)
			queries := f.dns.Queries("")
			// Several failed refreshes, and many sync rounds.
			require.Eventually(t, func() bool { return f.dns.Queries("") >= queries+4 }, waitFor, tick, "the counter stopped asking DNS")
			waitRounds(t, a, 20, nil)

			assert.Equal(t, 3, st.connected(), "connections during the DNS outage")
			assert.Equal(t, 3, st.target(t), "target during the DNS outage")
			assert.Equal(t, 3, a.ClientSet().Target(), "target during the DNS outage")
			assert.Equal(t, dials, st.allDials(t), "the agent dialed during the DNS outage")

			f.dns.ClearFault()
			extra := f.start(1, nil)
			f.publish(append(servers, extra...)...)
			waitHolding(t, a, 4)
		})
	}
}

func TestScenarioNXDOMAINDuringRollout(t *testing.T) {
	for _, mode := range dialModes {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			servers := f.start(3, nil)
			a, cache := f.converge(servers, mode, func(cfg *agent.Config) { cfg.HoldDown = 5 * time.Second })
			st := agentState{a}
			minTarget := math.MaxInt
			sample := func() { minTarget = min(minTarget, st.target(t), a.ClientSet().Target()) }

			// The Service's endpoints vanish for a moment (NXDOMAIN) while
			// one server is replaced.
			f.dns.SetRecords()
			waitCount(t, cache, 0, sample)
			next := f.start(1, nil)
			live := []*Server{servers[0], servers[1], next[0]}
			f.lb.SetBackends(live[0].AgentAddr(), live[1].AgentAddr(), live[2].AgentAddr())
			servers[2].Stop()
			waitRounds(t, a, 10, sample)
			if mode == agent.DialLoadBalancer {
				// The target held: the agent found the new server through
				// the balancer while DNS said nothing.
				require.Eventually(t, func() bool { sample(); return st.connected() == 3 && next[0].Core().Ready() }, waitFor, tick,
					"agent never reached the new server during NXDOMAIN")
			}

			f.publish(live...)
			waitCount(t, cache, 3, sample)
			require.Eventually(t, func() bool { sample(); return st.connected() == 3 && next[0].Core().Ready() }, waitFor, tick,
				"agent never reached the new server")
			waitRounds(t, a, 5, sample)
			assert.Equal(t, 3, minTarget, "the target left 3 during the NXDOMAIN")
			assert.Equal(t, 3, st.connected())
		})
	}
}

func TestScenarioUnreachableServers(t *testing.T) {
	f := newFleet(t)
	servers := f.start(3, nil)
	addrs := []string{deadAddr(t, "127.0.0.60"), deadAddr(t, "127.0.0.61")}
	for _, s := range servers {
		addrs = append(addrs, s.AgentAddr())
	}
	f.lb.SetBackends(addrs[2:]...)
	f.dns.SetRecords(dnstest.SRVRecords(srvName, addrs...)...)
	a, _ := f.dnsAgent(agent.DialResolved, nil)
	st := agentState{a}
	require.Eventually(t, func() bool { return st.connected() == 3 && st.target(t) == 5 }, waitFor, tick,
		"agent never held the 3 reachable servers (connected %d, target %d)", st.connected(), st.target(t))

	// Each unreachable address backs off on its own, from 20 ms growing
	// x1.5 (jitter 20%) to 200 ms: its first five dials span at least
	// 0.8 x (20+30+45+67.5) ms = 130 ms. A tight loop would make ten in
	// a few milliseconds.
	const dials = 10
	errs, start := st.dials(t, "error"), time.Now()
	require.Eventually(t, func() bool { return st.dials(t, "error")-errs >= dials }, waitFor, time.Millisecond, "the agent stopped trying the unreachable servers")
	elapsed := time.Since(start)
	t.Logf("%d failed dials took %v (%d ok, %d duplicate in all)", dials, elapsed, st.dials(t, "ok"), st.dials(t, "duplicate"))
	assert.GreaterOrEqual(t, elapsed, 100*time.Millisecond, "the failed dials did not back off")
	assert.Equal(t, 3, st.connected())
}

// TestScenarioHugeAnswer runs in lb mode only: an answer of 10000 SRV
// records is truncated even over TCP and then carries no glue, so in
// resolved mode the endpoints would be the SRV target names, which gRPC
// would resolve through the machine's resolver, off loopback.
func TestScenarioHugeAnswer(t *testing.T) {
	for _, mode := range []agent.DialMode{agent.DialLoadBalancer} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFleet(t)
			servers := f.start(3, nil)
			addrs := make([]string, 0, 10000)
			for _, s := range servers {
				addrs = append(addrs, s.AgentAddr())
			}
			// The rest point at loopback addresses where nothing listens.
			for i := len(addrs); i < 10000; i++ {
				addrs = append(addrs, fmt.Sprintf("127.1.%d.%d:6443", i/250, 1+i%250))
			}
			f.lb.SetBackends(addrs[:3]...)
			f.dns.SetRecords(dnstest.SRVRecords(srvName, addrs...)...)
			// The answer is 64 KiB over TCP after a truncated one over
			// UDP: on a loaded machine, under the race detector, building
			// and parsing them can take longer than the harness's short
			// query timeout, and the counter would then fall back (to 1,
			// or to the truncated UDP answer's count). Timeouts are not
			// what this test is about: allow as long as any wait here.
			a, cache := f.dnsAgent(mode, nil, func(c *servercounter.Config) { c.Timeout = waitFor })
			res, err := cache.Count(t.Context())
			require.NoError(t, err)
			t.Logf("DNS count: %d (found %d, truncated %v, over %v)", res.Count, res.Found, res.Truncated, res.Transport)
			assert.Equal(t, DNSMaxCount, res.Count, "count not capped")

			st := agentState{a}
			require.Eventually(t, func() bool { return st.connected() == 3 && st.target(t) == DNSMaxCount }, waitFor, tick,
				"agent never held 3 servers aiming for %d (connected %d, target %d)", DNSMaxCount, st.connected(), st.target(t))
			// Through the balancer, duplicates are retried at once for a
			// while (a budget of about 10 x target / missing in a row),
			// then one dial per sync round, as upstream: never thousands.
			first := st.allDials(t)
			waitRounds(t, a, 20, nil)
			dials := st.allDials(t)
			t.Logf("dials: %d (ok %d, duplicate %d, error %d)", dials, st.dials(t, "ok"), st.dials(t, "duplicate"), st.dials(t, "error"))
			assert.Less(t, dials-first, 20+12, "more than one dial a round after the budget")
			assert.Less(t, dials, 1000, "the agent dialed as if to reach thousands of servers")

			const rounds = 5
			waitRounds(t, a, rounds, nil)
			assert.LessOrEqual(t, st.allDials(t)-dials, rounds+1, "dials per sync round once backing off")
			assert.Equal(t, 3, st.connected())
		})
	}
}

func TestScenarioUpstreamAgentDNSCountingServers(t *testing.T) {
	f := newFleet(t)
	var counters []*servercounter.CachedServerCounter
	count := func() servercounter.ServerCounter {
		c := DNSCounter(t, f.dns.Addr(), srvName)
		counters = append(counters, c)
		return c
	}
	servers := f.start(4, count)
	// Every server counts what DNS says before the agent comes: a count
	// read before (NXDOMAIN, so 0) would stick, as the agent learns counts
	// only from servers it newly connects to.
	waitAllCount := func(n int) {
		for _, c := range counters {
			waitCount(t, c, n, nil)
		}
	}
	f.publish(servers[:2]...)
	waitAllCount(2)
	// Upstream learns a changed count only by opening streams:
	// --sync-forever.
	a := f.upstreamAgent(func(cfg *agent.Config) { cfg.SyncForever = true })
	waitHolding(t, a, 2)

	f.publish(servers...)
	waitAllCount(4)
	waitHolding(t, a, 4)
	assert.Equal(t, 4.0, metric(t, a.Registry(), metricAgentTarget, "source", "received"))
}

// Make sure the records SRVRecords builds are what the counter reads.
func TestSRVRecordsEndpoints(t *testing.T) {
	rrs := dnstest.SRVRecords(srvName, "127.0.0.10:1001", "127.0.0.11:1002")
	require.Len(t, rrs, 4)
	srv, ok := rrs[0].(*dns.SRV)
	require.True(t, ok)
	assert.Equal(t, "s0.proxy.test.svc.cluster.local.", srv.Target)
	f := newFleet(t)
	f.dns.SetRecords(rrs...)
	cache := DNSCounter(t, f.dns.Addr(), srvName)
	res, err := cache.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, res.Count)
	assert.Equal(t, []string{"127.0.0.10:1001", "127.0.0.11:1002"}, res.Endpoints(443))
}
