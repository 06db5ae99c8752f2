package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/balancertest"
)

// Scenario 1: three ready endpoints.
func TestThreeReadyEndpoints(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startReady(3)
	out, exit := e.probeCount(e.svc.FQDN())
	assert.Equal(t, "3", out, "A form")
	assert.Equal(t, 0, exit)
	full := e.probe(e.svc.SRVName("agent"))
	assert.Contains(t, full.Output, ";; COUNT: 3, outcome: records")
	t.Logf("probe:\n%s", full.Output)

	agents := e.startAgents(3, "resolved", nil)
	waitConnections(t, agents, 3, 30*time.Second)
	e.requestThroughEach(ips...)
	for _, a := range agents {
		m, err := a.Metrics()
		require.NoError(t, err)
		assert.Zero(t, m.Sum("servercount_agent_server_dials_total", "result", "error"), "%s dial errors", a.Name)
		assert.Equal(t, 3.0, m.Sum("servercount_agent_server_dials_total", "result", "ok"), "%s: 3 servers in 3 dials", a.Name)
	}
}

// newLB starts a load balancer in front of ips' agent ports.
func (e *env) newLB(ips ...string) *balancertest.Balancer {
	e.t.Helper()
	lb, err := balancertest.New(e.agentAddrs(ips...)...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { lb.Close() })
	return lb
}

// Scenario 2: scale up from 3 to 5, in both dial modes.
func TestScaleUp(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startReady(3)
	lb := e.newLB(ips...)
	byMode := map[string][]*harness.Agent{
		"resolved": e.startAgents(3, "resolved", nil),
		"lb":       e.startAgents(3, "lb", lb),
	}
	for _, agents := range byMode {
		waitConnections(t, agents, 3, 30*time.Second)
	}

	ips = append(ips, e.startServers(3, 5)...)
	lb.SetBackends(e.agentAddrs(ips...)...)
	start := time.Now()
	e.setReady(ips...)
	var results strings.Builder
	var wg sync.WaitGroup
	var mu sync.Mutex
	took := map[string]time.Duration{}
	for _, agents := range byMode {
		for _, a := range agents {
			wg.Go(func() {
				deadline := time.Now().Add(30 * time.Second)
				for time.Now().Before(deadline) {
					if a.Connections() == 5 {
						mu.Lock()
						took[a.Name] = time.Since(start)
						mu.Unlock()
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	for mode, agents := range byMode {
		for _, a := range agents {
			d, ok := took[a.Name]
			if !assert.True(t, ok, "%s (%s) did not reach 5 connections within 30s: %d", a.Name, mode, a.Connections()) {
				continue
			}
			m, err := a.Metrics()
			require.NoError(t, err)
			line := fmt.Sprintf("%s mode=%s 3->5 seconds=%.3f dials ok=%v duplicate=%v error=%v",
				a.Name, mode, d.Seconds(), m.Sum("servercount_agent_server_dials_total", "result", "ok"),
				m.Sum("servercount_agent_server_dials_total", "result", "duplicate"), m.Sum("servercount_agent_server_dials_total", "result", "error"))
			t.Log(line)
			results.WriteString(line + "\n")
		}
	}
	waitConnections(t, byMode["resolved"], 5, 10*time.Second)
	waitConnections(t, byMode["lb"], 5, 10*time.Second)
	e.requestThroughEach(ips...)
	require.NoError(t, harness.WriteFile(t.ArtifactDir(), "scale-up-seconds.txt", results.String()))
}

// Scenario 3: scale down from 5 to 2.
func TestScaleDown(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startReady(5)
	lb := e.newLB(ips...)
	agents := append(e.startAgents(2, "resolved", nil), e.startAgents(2, "lb", lb)...)
	waitConnections(t, agents, 5, 30*time.Second)

	keep := ips[:2]
	e.setReady(keep...)
	lb.SetBackends(e.agentAddrs(keep...)...)
	e.waitCount(e.svc.SRVName("agent"), 2)
	for _, ip := range ips[2:] {
		e.stopServer(ip)
	}
	waitConnections(t, agents, 2, 20*time.Second)

	// Settled: errors must not keep growing.
	before := make([]float64, len(agents))
	for i, a := range agents {
		m, err := a.Metrics()
		require.NoError(t, err)
		before[i] = m.Sum("servercount_agent_server_dials_total", "result", "error")
		assert.LessOrEqual(t, before[i], 10.0, "%s: error dials during the scale-down", a.Name)
	}
	sample(t, agents, 3*time.Second, func(a *harness.Agent, conns int) {
		assert.Equal(t, 2, conns, "%s after settling", a.Name)
	})
	for i, a := range agents {
		m, err := a.Metrics()
		require.NoError(t, err)
		after := m.Sum("servercount_agent_server_dials_total", "result", "error")
		t.Logf("%s: error dials %v during the scale-down, %v after settling", a.Name, before[i], after-before[i])
		assert.LessOrEqual(t, after-before[i], 1.0, "%s: error dials piled up after settling", a.Name)
		assert.Equal(t, 2, a.Target("dns"))
	}
	e.requestThroughEach(keep...)
}

// sample reads every agent's connections every 50ms for d and calls check
// with each reading.
func sample(t *testing.T, agents []*harness.Agent, d time.Duration, check func(a *harness.Agent, conns int)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, a := range agents {
			check(a, a.Connections())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// minConns tracks the fewest connections each agent held, from a
// background sampler.
type minConns struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex // guards min and samples
	min  map[string]int
	n    int
}

func startMinConns(agents []*harness.Agent) *minConns {
	m := &minConns{stop: make(chan struct{}), min: map[string]int{}}
	m.wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, a := range agents {
				c := a.Connections()
				m.mu.Lock()
				if cur, ok := m.min[a.Name]; !ok || c < cur {
					m.min[a.Name] = c
				}
				m.n++
				m.mu.Unlock()
			}
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
		}
	})
	return m
}

func (m *minConns) Stop() (map[string]int, int) {
	close(m.stop)
	m.wg.Wait()
	return m.min, m.n
}

// Scenario 4: no ready endpoint (NXDOMAIN), then three again.
func TestZeroReadyEndpoints(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startReady(3)
	agents := e.startAgents(3, "resolved", nil)
	waitConnections(t, agents, 3, 30*time.Second)

	sampler := startMinConns(agents)
	require.NoError(t, e.svc.SetEndpoints(t.Context()))
	var r harness.ProbeResult
	require.Eventually(t, func() bool {
		r = e.probe(e.svc.SRVName("agent"))
		return r.Exit == 1
	}, 20*time.Second, 100*time.Millisecond, "probe exit 1 (a valid zero) for no ready endpoint: %d %s", r.Exit, r.Output)
	assert.Contains(t, r.Output, "NXDOMAIN")
	t.Logf("probe with no ready endpoint (exit %d):\n%s", r.Exit, r.Output)
	out, exit := e.probeCount(e.svc.FQDN())
	assert.Equal(t, 1, exit, "A form: %s", out)
	// Hold the zero longer than the hold-down (2s) and several cache TTLs.
	phase := time.Now()
	require.Eventually(t, func() bool {
		for _, a := range agents {
			m, err := a.Metrics()
			if err != nil || m.Sum("servercount_agent_dns_lookups_total", "outcome", "nxdomain") < 3 {
				return false
			}
		}
		return time.Since(phase) > 4*time.Second
	}, 20*time.Second, 100*time.Millisecond, "agents saw NXDOMAIN")
	mins, n := sampler.Stop()
	for _, a := range agents {
		assert.Equal(t, 3, mins[a.Name], "%s dropped connections during NXDOMAIN (%d samples)", a.Name, n)
		t.Logf("%s during NXDOMAIN: fewest connections %d, target %d (dns)", a.Name, mins[a.Name], a.Target("dns"))
	}
	e.requestThroughEach(ips...)

	e.publishReady(ips...)
	waitConnections(t, agents, 3, 20*time.Second)
	e.requestThroughEach(ips...)
}

// Scenario 5: not-ready endpoints, and publishNotReadyAddresses.
//
// CoreDNS counts the endpoints whose ready condition is not false; it does
// not read publishNotReadyAddresses. That field acts through the
// EndpointSlice controller, which then writes ready=true for every pod. This
// suite has no controller, so it writes the slices as the controller would.
func TestNotReadyEndpoints(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startServers(0, 5)
	eps := append(harness.Ready(ips[:3]...), harness.Endpoint{IP: ips[3]}, harness.Endpoint{IP: ips[4]})
	require.NoError(t, e.svc.SetEndpoints(t.Context(), eps...))
	e.waitCount(e.svc.SRVName("agent"), 3)
	out, _ := e.probeCount(e.svc.FQDN())
	assert.Equal(t, "3", out, "A form counts only ready endpoints")
	agents := e.startAgents(2, "resolved", nil)
	waitConnections(t, agents, 3, 30*time.Second)

	pnr, err := harness.CreateHeadlessService(t.Context(), the.cluster.Client, harness.ServiceConfig{
		Namespace: e.ns, Name: "proxy-server-pnr", Ports: e.svc.Ports, PublishNotReadyAddresses: true,
	})
	require.NoError(t, err)
	// What the EndpointSlice controller writes for publishNotReadyAddresses:
	// every pod ready.
	require.NoError(t, pnr.SetEndpoints(t.Context(), harness.Ready(ips...)...))
	e.waitCount(pnr.SRVName("agent"), 5)
	out, _ = e.probeCount(pnr.FQDN())
	assert.Equal(t, "5", out, "A form with publishNotReadyAddresses")
	pnrAgents := e.fleet.StartAgent(t, harness.AgentConfig{
		Name: "agent-" + e.ns + "-pnr", DNSName: pnr.SRVName("agent"), DNSServer: the.cluster.DNS.Addr, DialMode: "resolved",
	})
	waitConnections(t, []*harness.Agent{pnrAgents}, 5, 30*time.Second)

	// The field alone changes nothing in DNS: ready=false is not counted,
	// even with publishNotReadyAddresses.
	require.NoError(t, pnr.SetEndpoints(t.Context(), eps...))
	e.waitCount(pnr.SRVName("agent"), 3)
}

// Scenario 6: CoreDNS down for 20 seconds.
func TestDNSOutage(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startServers(0, 4)
	e.publishReady(ips[:3]...)
	agents := e.startAgents(3, "resolved", nil)
	waitConnections(t, agents, 3, 30*time.Second)

	failures := func(a *harness.Agent) float64 {
		m, err := a.Metrics()
		require.NoError(t, err)
		var n float64
		for _, o := range []string{"timeout", "network", "refused", "servfail", "malformed"} {
			n += m.Sum("servercount_agent_dns_lookups_total", "outcome", o)
		}
		return n
	}
	before := map[string]float64{}
	for _, a := range agents {
		before[a.Name] = failures(a)
	}
	the.cluster.DNS.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			assert.NoError(t, the.cluster.DNS.Start(), "restart CoreDNS for the other tests")
		}
	})
	r := e.probe(e.svc.SRVName("agent"))
	assert.Equal(t, 2, r.Exit, "probe with CoreDNS down: unknown count: %s", r.Output)

	sampler := startMinConns(agents)
	minTarget := map[string]int{}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, a := range agents {
			tg := a.Target("dns")
			if low, seen := minTarget[a.Name]; !seen || tg < low {
				minTarget[a.Name] = tg
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	mins, n := sampler.Stop()
	for _, a := range agents {
		f := failures(a) - before[a.Name]
		m, err := a.Metrics()
		require.NoError(t, err)
		t.Logf("%s during the outage: fewest connections %d (%d samples), lowest DNS target %d, failed lookups %v (timeout %v, network %v)",
			a.Name, mins[a.Name], n, minTarget[a.Name], f,
			m.Sum("servercount_agent_dns_lookups_total", "outcome", "timeout"), m.Sum("servercount_agent_dns_lookups_total", "outcome", "network"))
		assert.Equal(t, 3, mins[a.Name], "%s kept its connections", a.Name)
		assert.Equal(t, 3, minTarget[a.Name], "%s kept its count", a.Name)
		assert.Positive(t, f, "%s: the metrics show failed lookups", a.Name)
	}

	require.NoError(t, the.cluster.DNS.Start())
	restarted = true
	// Recovery: a change after the restart reaches the agents.
	e.publishReady(ips...)
	waitConnections(t, agents, 4, 30*time.Second)
	e.requestThroughEach(ips...)
}

// Scenario 7: rolling replacement of every server, one at a time.
func TestRollingReplacement(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startReady(3)
	lb := e.newLB(ips...)
	agents := append(e.startAgents(3, "resolved", nil), e.startAgents(1, "lb", lb)...)
	waitConnections(t, agents, 3, 30*time.Second)

	sampler := startMinConns(agents)
	live := append([]string(nil), ips...)
	for i := range 3 {
		old, repl := e.ip(i), e.startServers(3+i, 4+i)[0]
		live = append(live, repl)
		e.setReady(live...)
		lb.SetBackends(e.agentAddrs(live...)...)
		waitConnections(t, agents, 4, 30*time.Second)

		live = live[1:]
		e.setReady(live...)
		lb.SetBackends(e.agentAddrs(live...)...)
		e.waitCount(e.svc.SRVName("agent"), 3)
		e.stopServer(old)
		waitConnections(t, agents, 3, 30*time.Second)
		t.Logf("replaced %s by %s", old, repl)
	}
	mins, n := sampler.Stop()
	for _, a := range agents {
		t.Logf("%s: fewest connections %d (%d samples)", a.Name, mins[a.Name], n)
		assert.GreaterOrEqual(t, mins[a.Name], 2, "%s held fewer than 2 connections", a.Name)
	}
	e.requestThroughEach(live...)
}

// Scenario 8: a wrong port name in the SRV query.
func TestWrongPortName(t *testing.T) {
	e := newEnv(t, false)
	e.startReady(2)
	r := e.probe(e.svc.SRVName("agnet"))
	t.Logf("probe of a wrong port name (exit %d):\n%s", r.Exit, r.Output)
	assert.Equal(t, 1, r.Exit)
	assert.Contains(t, r.Output, "rcode: NXDOMAIN")
	// The likely cause, explained: a port name the Service does not have.
	assert.Contains(t, r.Output, ";; HINT:")
	assert.Contains(t, r.Output, "no port of that name")
}
