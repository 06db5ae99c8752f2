package proxytest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/agent"
)

// BenchmarkConvergence measures how an agent counting servers through DNS
// follows a scale-up from N to 2N servers: the time from the DNS change
// (and the load balancer's) until it is connected to all 2N, and the
// server dials (ok, duplicate and failed) it spent on the way. The agent
// has the production sync interval (1 s, capped at 10 s), so the numbers
// compare with upstream agents', whose every duplicate through the load
// balancer costs a full sync interval.
//
// Each iteration starts a fresh agent holding N (untimed), then flips DNS
// and the balancer to 2N (timed). The metrics are medians over the
// iterations:
//
//	dials/op           server dials from the flip until 2N are connected
//	ms-to-converge/op  milliseconds from the flip until 2N are connected
//	timeouts           iterations that did not converge within convergeLimit
//	coupon-dials       the expected dials: N in resolved mode (one per new
//	                   server); through a random balancer, the coupon
//	                   collector's sum over k = 1..N of 2N/k = 2N x H(N)
//
// Run with: go test -run '^$' -bench Convergence -benchtime 3x ./internal/proxytest/
func BenchmarkConvergence(b *testing.B) {
	for _, mode := range dialModes {
		for _, n := range []int{3, 10} {
			b.Run(fmt.Sprintf("mode=%s/N=%d", mode, n), func(b *testing.B) { benchConvergence(b, mode, n) })
		}
	}
}

func benchConvergence(b *testing.B, mode agent.DialMode, n int) {
	f := newFleet(b)
	servers := f.start(2*n, nil)
	var dials, millis []float64
	timeouts := 0
	b.StopTimer()
	b.ResetTimer()
	for i := range b.N {
		// The previous iteration's agent is gone from every server.
		require.Eventually(b, func() bool {
			for _, s := range servers {
				if s.Core().Ready() {
					return false
				}
			}
			return true
		}, waitFor, tick, "the previous agent's streams never ended")
		f.publish(servers[:n]...)
		cache := DNSCounter(b, f.dns.Addr(), srvName)
		cfg := DNSAgentConfigFor(fmt.Sprintf("agent-%d", i), f.lb.Addr(), cache, mode)
		cfg.SyncInterval, cfg.SyncIntervalCap = agent.DefaultSyncInterval, agent.DefaultSyncIntervalCap
		cfg.HoldDown = agent.DefaultHoldDown
		a := StartAgent(b, f.env, cfg)
		waitAgentConnected(b, f, a, servers[:n])
		st := agentState{a}
		before := st.allDials(b)

		b.StartTimer()
		f.publish(servers...)
		elapsed, ok := waitConnected(a, 2*n, convergeLimit)
		b.StopTimer()
		if !ok {
			timeouts++
			b.Logf("iteration %d: connected to %d of %d servers after %v", i, a.ClientSet().Connected(), 2*n, convergeLimit)
		}

		dials = append(dials, float64(st.allDials(b)-before))
		millis = append(millis, float64(elapsed.Microseconds())/1000)
		a.Stop()
		_ = cache.Close() // Close does not fail
	}
	b.ReportMetric(median(dials), "dials/op")
	b.ReportMetric(median(millis), "ms-to-converge/op")
	b.ReportMetric(couponDials(mode, n), "coupon-dials")
	b.ReportMetric(float64(timeouts), "timeouts")
	b.ReportMetric(0, "ns/op") // the wall time is ms-to-converge, without the setup noise
}

// convergeLimit bounds one convergence. An iteration that takes longer
// counts in the "timeouts" metric, with convergeLimit as its time.
const convergeLimit = 20 * time.Second

// waitAgentConnected waits, untimed, until the agent holds the n servers
// of servers that are published. Meanwhile the load balancer sends only to
// servers the agent has not reached, so that the setup never depends on
// the coupon collector's luck.
func waitAgentConnected(b *testing.B, f *fleet, a *Agent, servers []*Server) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for a.ClientSet().Connected() < len(servers) {
		var missing []string
		for _, s := range servers {
			if !s.Core().Ready() {
				missing = append(missing, s.AgentAddr())
			}
		}
		f.lb.SetBackends(missing...)
		if time.Now().After(deadline) {
			b.Fatalf("agent connected to %d of %d servers after a minute", a.ClientSet().Connected(), len(servers))
		}
		waitConnected(a, a.ClientSet().Connected()+1, 10*time.Millisecond)
	}
	f.publish(servers...)
	waitHolding(b, a, len(servers))
}

// waitConnected polls the agent every millisecond until it is connected to
// n servers and returns how long that took; ok is false after limit.
func waitConnected(a *Agent, n int, limit time.Duration) (elapsed time.Duration, ok bool) {
	start := time.Now()
	ticker := time.NewTicker(time.Millisecond)
	defer ticker.Stop()
	deadline := time.After(limit)
	for a.ClientSet().Connected() < n {
		select {
		case <-ticker.C:
		case <-deadline:
			return time.Since(start), false
		}
	}
	return time.Since(start), true
}

// couponDials is the expected number of dials to go from n to 2n servers:
// n when each dial reaches a new server, else the coupon collector's
// sum over k = 1..n of 2n/k (the k-th last new server is found with
// probability k/2n per dial).
func couponDials(mode agent.DialMode, n int) float64 {
	if mode == agent.DialResolved {
		return float64(n)
	}
	var e float64
	for k := 1; k <= n; k++ {
		e += float64(2*n) / float64(k)
	}
	return e
}

// median returns the median of xs, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
