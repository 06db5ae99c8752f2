package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/e2e/harness"
)

// End to end: 20 agents count 3 proxy-servers through real
// CoreDNS (SRV records, the suite's TTL of 1 s), with the binary's DNS
// cache defaults. CoreDNS is
// stopped for 60 s (its port then answers every query with ICMP port
// unreachable: a failure at once, the hardest case for a fleet's retry
// load) and started again. What the fleet asks of DNS in each phase, and
// how long until every agent's count is fresh again:
//   - healthy, before and after: CoreDNS's own count of queries
//     (coredns_dns_requests_total), per agent and second: one a TTL;
//   - during the outage's second half: the agents' failed lookups (one
//     query each, the back-off having started), per agent and second:
//     at most 0.1 (5.4 before the back-off);
//   - after the restart: every agent has a good count within the back-off
//     cap (30 s) and one TTL, the median within half of that.
func TestDNSOutageAtFleetScale(t *testing.T) {
	const (
		agents   = 20
		healthy  = 30 * time.Second
		outage   = 60 * time.Second
		retryCap = 30 * time.Second
		ttl      = dnsTTL * time.Second
	)
	e := newEnv(t, false)
	e.startReady(3)
	var fleet []*harness.Agent
	for i := range agents {
		fleet = append(fleet, e.fleet.StartAgent(t, harness.AgentConfig{
			Name: fmt.Sprintf("agent-%s-%d", e.ns, i), DNSName: e.svc.SRVName("agent"), DNSServer: the.cluster.DNS.Addr,
			DialMode: "resolved", CacheDefaults: true,
		}))
	}
	waitConnections(t, fleet, 3, 60*time.Second)

	dnsRate := func(window time.Duration) float64 {
		before := the.cluster.DNS.Requests()
		require.GreaterOrEqual(t, before, 0.0, "read CoreDNS's metrics")
		time.Sleep(window) // the measurement's window, not a synchronisation
		after := the.cluster.DNS.Requests()
		return (after - before) / window.Seconds() / agents
	}
	lookups := func(outcome ...string) []float64 {
		var out []float64
		for _, a := range fleet {
			m, err := a.Metrics()
			require.NoError(t, err)
			var n float64
			for _, o := range outcome {
				n += m.Sum("servercount_agent_dns_lookups_total", "outcome", o)
			}
			out = append(out, n)
		}
		return out
	}
	failures := []string{"timeout", "network", "refused", "servfail", "malformed"}
	sum := func(xs []float64) float64 {
		var s float64
		for _, x := range xs {
			s += x
		}
		return s
	}

	before := dnsRate(healthy)

	the.cluster.DNS.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			assert.NoError(t, the.cluster.DNS.Start(), "restart CoreDNS for the other tests")
		}
	})
	time.Sleep(outage / 2) // the outage's first half: the back-off grows
	f0 := sum(lookups(failures...))
	time.Sleep(outage / 2)
	during := (sum(lookups(failures...)) - f0) / (outage / 2).Seconds() / agents
	for _, a := range fleet {
		assert.Equal(t, 3, a.Connections(), "%s lost a server to the DNS outage", a.Name)
	}

	good := lookups("records")
	require.NoError(t, the.cluster.DNS.Start())
	restarted = true
	back := time.Now()
	fresh := make([]time.Duration, agents)
	pending := agents
	for pending > 0 && time.Since(back) < 2*(retryCap+ttl) {
		now := lookups("records")
		for i := range fleet {
			if fresh[i] == 0 && now[i] > good[i] {
				fresh[i] = time.Since(back)
				pending--
			}
		}
		time.Sleep(200 * time.Millisecond) // the poll's period
	}
	require.Zero(t, pending, "%d agents had no good count %v after CoreDNS came back", pending, 2*(retryCap+ttl))
	after := dnsRate(healthy)

	slices.Sort(fresh)
	median, last := fresh[agents/2], fresh[agents-1]
	t.Logf("queries per agent per second: %.3f healthy before (CoreDNS's count), %.3f in the outage's second half (failed lookups), %.3f healthy after", before, during, after)
	t.Logf("a good count again after CoreDNS's restart: median %v, last %v", median.Round(100*time.Millisecond), last.Round(100*time.Millisecond))
	assert.LessOrEqual(t, during, 0.1, "queries per agent per second during the outage")
	// The bounds, to the resolution of the poll.
	assert.LessOrEqual(t, last, retryCap+ttl+200*time.Millisecond, "the last agent's count was fresh too late")
	assert.LessOrEqual(t, median, (retryCap+ttl)/2+200*time.Millisecond, "the median agent's count was fresh too late")
}
