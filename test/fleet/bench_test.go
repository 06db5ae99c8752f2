package fleet

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/agent"
)

// The benchmarks' flags, after -args or through BENCH_FLEET_FLAGS.
var (
	flagAgents      = flag.Int("fleet.agents", 1000, "agents in each benchmark's fleet")
	flagIdle        = flag.Duration("fleet.idle", 60*time.Second, "how long BenchmarkIdleCost measures an idle fleet, in each phase")
	flagHeapProfile = flag.String("fleet.server-heap-profile", "",
		"BenchmarkServerProcess writes the server process's heap profile, with every agent connected, to this file (an absolute path)")
	flagCPUProfile = flag.String("fleet.server-cpu-profile", "",
		"BenchmarkIdleCost writes the CPU profile of each server process (ours, then grpc-floor) in each idle phase to this path with the server and the phase appended, e.g. -ours-5s (an absolute path)")
	flagHeartbeat      = flag.Duration("fleet.heartbeat", 5*time.Second, "the server's --heartbeat-interval in BenchmarkIdleCost's second phase")
	flagAgentHeartbeat = flag.Duration("fleet.agent-heartbeat", 0, "the agents' heartbeat interval in BenchmarkIdleCost (0: the agent's default)")
	flagSteady         = flag.Duration("fleet.steady", 60*time.Second, "how long BenchmarkSteady watches a converged fleet")
)

// benchWait bounds each wait of a benchmark: a fleet that has not
// converged by then is reported as such.
const benchWait = 5 * time.Minute

// newBenchFleet raises the file limit and returns a fleet of
// -fleet.agents agents and 3 servers in mode.
func newBenchFleet(b *testing.B, mode agent.DialMode) *Fleet {
	b.Helper()
	limit := raiseFileLimit(b)
	n := *flagAgents
	if fit := (limit - spareFiles) / lbFilesPerAgent; mode == agent.DialLoadBalancer && n > fit {
		b.Logf("LB mode: %d agents need about %d open files, the limit is %d: running %d agents", n, n*lbFilesPerAgent+spareFiles, limit, fit)
		n = fit
	}
	return New(b, Config{Agents: n, Mode: mode})
}

// lbFilesPerAgent is the open files one agent holding 3 servers costs
// this process in LB mode: 12 for its 3 streams (agent, balancer twice,
// server), and room for duplicate dials being closed. spareFiles is the
// room for everything else.
const (
	lbFilesPerAgent = 16
	spareFiles      = 2000
)

// raiseFileLimit raises the soft limit on open files to the hard one, and
// the hard one too when the process may (root with CAP_SYS_RESOURCE), and
// returns the limit: each agent stream is a socket at both ends, and in
// LB mode two more in the balancer. At 1000 agents in LB mode, 20000
// files are not enough.
func raiseFileLimit(b *testing.B) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Logf("read the open file limit: %v", err)
		return 0
	}
	// In LB mode an agent stream is 4 sockets (agent, balancer twice,
	// server), and duplicates being closed add more. Only a privileged
	// process may raise the hard limit.
	want := uint64(lbFilesPerAgent**flagAgents + spareFiles)
	if lim.Max < want && os.Geteuid() == 0 {
		raised := lim
		raised.Cur, raised.Max = want, want
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			return int(want)
		}
		// Root without CAP_SYS_RESOURCE, as in a container: keep the
		// hard limit.
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Logf("raise the open file limit to %d: %v", lim.Max, err)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	return int(lim.Cur)
}

// converge starts the fleet's agents and waits until every one holds n
// servers, failing the benchmark if they do not within benchWait. It
// returns the start and when each agent got there.
func converge(b *testing.B, f *Fleet, n int) (time.Time, []time.Time) {
	b.Helper()
	// The wait runs while the agents start: on a loaded machine the
	// first ones converge before the last ones start.
	ctx, cancel := context.WithTimeout(b.Context(), benchWait)
	defer cancel()
	type result struct {
		reached []time.Time
		err     error
	}
	done := make(chan result, 1)
	go func() {
		reached, err := f.Wait(ctx, Holding(n))
		done <- result{reached, err}
	}()
	start := f.StartAgents()
	r := <-done
	if r.err != nil {
		b.Fatalf("cold start: %v", r.err)
	}
	return start, r.reached
}

// waitAll waits until cond holds for every agent, failing the benchmark
// after benchWait.
func waitAll(b *testing.B, f *Fleet, what string, cond func(*Agent) bool) []time.Time {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), benchWait)
	defer cancel()
	reached, err := f.Wait(ctx, cond)
	if err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	return reached
}

// seconds returns how long after start the last and the median agent
// reached their condition.
func seconds(start time.Time, reached []time.Time) (last, median float64) {
	ds := make([]float64, len(reached))
	for i, t := range reached {
		ds[i] = t.Sub(start).Seconds()
	}
	slices.Sort(ds)
	return ds[len(ds)-1], ds[len(ds)/2]
}

// lags returns, per agent, after[i] - before[i] in seconds, the largest
// and the median.
func lags(before, after []time.Time) (last, median float64) {
	ds := make([]float64, len(after))
	for i := range after {
		ds[i] = max(0, after[i].Sub(before[i]).Seconds())
	}
	slices.Sort(ds)
	return ds[len(ds)-1], ds[len(ds)/2]
}

// reportFollow reports how long after at the last and the median agent
// held the new set of servers, and the largest and median lag between an
// agent's DNS counter showing it (seen) and the agent holding it (held).
func reportFollow(b *testing.B, at time.Time, seen, held []time.Time) {
	last, median := seconds(at, held)
	lagLast, lagMedian := lags(seen, held)
	b.ReportMetric(last, "s-last-agent")
	b.ReportMetric(median, "s-median-agent")
	b.ReportMetric(lagLast, "s-after-dns-last")
	b.ReportMetric(lagMedian, "s-after-dns-median")
}

// dials sums the agents' server dials with result (ok, duplicate, error).
func dials(f *Fleet, result string) float64 {
	var sum float64
	for _, a := range f.Agents() {
		if v, ok := metricstest.Value(a.Registry(), "servercount_agent_server_dials_total", "result", result); ok {
			sum += v
		}
	}
	return sum
}

// BenchmarkColdStart starts a whole fleet at once against 3 servers that
// DNS already lists, and reports the seconds until the last (and the
// median) agent holds all 3, and what the start cost per agent: Connect
// streams, TLS handshakes, DNS queries and TokenReviews. Since the whole
// fleet shares this machine's cores, it also reports the process's CPU
// time over the start (cpu-s), the cores that makes over the time the
// last agent took (cores-used: 2 on an idle 2-core machine, less when
// other jobs share it), and the open files per agent.
func BenchmarkColdStart(b *testing.B) {
	for _, mode := range []agent.DialMode{agent.DialResolved, agent.DialLoadBalancer} {
		b.Run("mode="+string(mode), func(b *testing.B) {
			f := newBenchFleet(b, mode)
			fds0, cpu0 := openFiles(b), cpuTime()
			start, reached := converge(b, f, DefaultServers)
			cpu, fds := cpuTime()-cpu0, openFiles(b)-fds0
			last, median := seconds(start, reached)
			c := f.Counts()
			n := float64(len(f.Agents()))
			b.ReportMetric(last, "s-last-agent")
			b.ReportMetric(median, "s-median-agent")
			b.ReportMetric(float64(c.Connects)/n, "connects/agent")
			b.ReportMetric(float64(c.Handshakes)/n, "handshakes/agent")
			b.ReportMetric(float64(c.DNSQueries)/n, "dns-queries/agent")
			b.ReportMetric(float64(c.TokenReviews)/n, "reviews/agent")
			b.ReportMetric(dials(f, "duplicate")/n, "duplicates/agent")
			b.ReportMetric(dials(f, "error")/n, "failed-dials/agent")
			b.ReportMetric(n, "agents")
			b.ReportMetric(f.StartTook().Seconds(), "s-starting-agents")
			b.ReportMetric(cpu.Seconds(), "cpu-s")
			b.ReportMetric(cpu.Seconds()/last, "cores-used")
			b.ReportMetric(float64(fds)/n, "fds/agent")
			b.ReportMetric(0, "ns/op") // the wall time is s-last-agent
			b.Logf("%s: %v", mode, c)
		})
	}
}

// BenchmarkScale grows a converged fleet's servers from 3 to 5 through
// DNS (two new servers, then the new records), then shrinks them back to
// 3 (the records first, and the two servers stop at once, as pods do
// when a Deployment scales down). For each step it reports the seconds
// from the DNS change until the last agent follows (holds the new set and
// counts it), the largest and median lag between an agent's DNS counter
// showing the new count and the agent holding it, Connect streams per
// agent, and the streams dropped on the way: on a scale-up every stream
// that ended, on a scale-down those that ended beyond the removed
// servers' own.
//
// Resolved mode only: 5 servers behind the load balancer need 4 sockets
// per agent stream, 20 per agent, over this machine's open file limit at
// 1000 agents.
func BenchmarkScale(b *testing.B) {
	f := newBenchFleet(b, agent.DialResolved)
	converge(b, f, 3)
	n := float64(len(f.Agents()))
	three := f.Servers()

	b.Run("step=3to5", func(b *testing.B) {
		five := append(slices.Clone(three), f.StartServer(), f.StartServer())
		before := f.Counts()
		cpu0 := cpuTime()
		at := time.Now()
		f.Publish(five...)
		seen, held := waitBoth(b, f, 5)
		d := f.Counts().Sub(before)
		cpu := cpuTime() - cpu0
		b.ReportMetric(cpu.Seconds(), "cpu-s")
		b.ReportMetric(cpu.Seconds()/time.Since(at).Seconds(), "cores-used")
		reportFollow(b, at, seen, held)
		b.ReportMetric(float64(d.Connects)/n, "connects/agent")
		b.ReportMetric(float64(d.StreamEnds), "dropped")
		b.ReportMetric(0, "ns/op")
		b.Logf("3 -> 5: %v", d)
	})
	b.Run("step=5to3", func(b *testing.B) {
		five := f.Servers()
		if len(five) != 5 {
			b.Skip("needs the 3 -> 5 step first")
		}
		before := f.Counts()
		failedBefore := dials(f, "error")
		at := time.Now()
		f.Publish(five[:3]...)
		for _, s := range five[3:] {
			s.Stop()
		}
		seen, held := waitBoth(b, f, 3)
		d := f.Counts().Sub(before)
		reportFollow(b, at, seen, held)
		b.ReportMetric(float64(d.Connects)/n, "connects/agent")
		b.ReportMetric((dials(f, "error")-failedBefore)/n, "failed-dials/agent")
		// Each agent loses its 2 streams to the stopped servers; any other
		// end is a stream to a kept server dropped.
		b.ReportMetric(float64(d.StreamEnds)-2*n, "dropped")
		b.ReportMetric(0, "ns/op")
		b.Logf("5 -> 3: %v", d)
	})
}

// waitBoth waits until every agent's DNS counter shows n and every agent
// holds n, and returns when each did each.
func waitBoth(b *testing.B, f *Fleet, n int) (seen, held []time.Time) {
	b.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Not waitAll: b.Fatalf must not run outside the benchmark's
		// goroutine. The held wait below fails first anyway.
		ctx, cancel := context.WithTimeout(b.Context(), benchWait)
		defer cancel()
		seen, _ = f.Wait(ctx, func(a *Agent) bool { return a.Counted() == n })
	}()
	held = waitAll(b, f, "follow", func(a *Agent) bool { return a.Counted() == n && a.Held() == n })
	<-done
	return seen, held
}

// BenchmarkRolling replaces each of a converged fleet's 3 servers in turn,
// as a Deployment's rolling update with a surge of 1 does: a new server
// starts, DNS (and the balancer) list it instead of the old one, and the
// old one stops; the next step starts once every agent holds 3 servers
// again. It reports the fewest servers any agent held at any moment, the
// seconds from the first step until every agent is whole after the last,
// and per agent the Connect streams, failed dials and TokenReviews the
// rollout cost.
func BenchmarkRolling(b *testing.B) {
	if testing.Short() {
		b.Skip("-short: a rollout of 1000 agents takes tens of seconds")
	}
	for _, mode := range []agent.DialMode{agent.DialResolved, agent.DialLoadBalancer} {
		b.Run("mode="+string(mode), func(b *testing.B) {
			f := newBenchFleet(b, mode)
			converge(b, f, 3)
			n := float64(len(f.Agents()))
			current := f.Servers()
			before := f.Counts()
			failedBefore := dials(f, "error")
			w := f.Watch()
			start := time.Now()
			var steps []float64
			for i := range current {
				stepStart := time.Now()
				old := current[i]
				current[i] = f.StartServer()
				f.Publish(current...)
				old.Stop()
				// An agent may still count the old server for a moment
				// after it stopped: the step ends when the servers of
				// the new set hold every agent, and every agent 3.
				ctx, cancel := context.WithTimeout(b.Context(), benchWait)
				served, err := f.WaitServers(ctx, current, len(f.Agents()))
				cancel()
				if err != nil {
					b.Fatalf("rolling step %d: %v", i, err)
				}
				reached := waitAll(b, f, "rolling step", func(a *Agent) bool { return a.Held() == 3 })
				last, _ := seconds(stepStart, append(reached, served))
				steps = append(steps, last)
			}
			whole := time.Since(start).Seconds()
			fewest := w.Stop()
			d := f.Counts().Sub(before)
			b.ReportMetric(n, "agents")
			b.ReportMetric(float64(fewest), "fewest-held")
			b.ReportMetric(whole, "s-until-whole")
			b.ReportMetric(slices.Max(steps), "s-longest-step")
			b.ReportMetric(float64(d.Connects)/n, "connects/agent")
			b.ReportMetric((dials(f, "error")-failedBefore)/n, "failed-dials/agent")
			b.ReportMetric(float64(d.TokenReviews)/n, "reviews/agent")
			b.ReportMetric(0, "ns/op")
			b.Logf("rolling (%s): steps %v s; %v", mode, steps, d)
		})
	}
}

// BenchmarkSteady watches a converged fleet (resolved mode) for
// -fleet.steady and reports Connect streams, DNS queries and TokenReviews
// per second; DNS queries per agent per TTL (at most 1 wanted); and the
// most DNS queries in any 100 ms window against the average per 100 ms
// (refreshes spread over the TTL keep it near 1).
//
// The baseline, in the same process and window: as many timers as
// agents, each firing once per TTL from a random phase, logged as the
// queries are (ref-peak/avg: what a perfectly spread fleet shows on this
// machine now), and the longest a 10 ms ticker was late (max-stall-ms):
// when the process does not run for a while, timers that were due fire
// together, and so do refreshes.
func BenchmarkSteady(b *testing.B) {
	if testing.Short() {
		b.Skip("-short: watches a fleet for a minute")
	}
	f := newBenchFleet(b, agent.DialResolved)
	converge(b, f, 3)
	// The cold start's queries come in step; the caches' first expiry is
	// spread over one TTL, so steady state starts one TTL on.
	settle := time.NewTimer(DefaultDNSTTL)
	select {
	case <-settle.C:
	case <-b.Context().Done():
		return
	}
	before := f.Counts()
	from := time.Now()
	ref := startReference(len(f.Agents()), DefaultDNSTTL)
	watch := time.NewTimer(*flagSteady)
	select {
	case <-watch.C:
	case <-b.Context().Done():
	}
	refTimes, stall := ref.stop()
	to := time.Now()
	d := f.Counts().Sub(before)
	secs := to.Sub(from).Seconds()
	n := float64(len(f.Agents()))
	const window = 100 * time.Millisecond
	times := f.QueryTimes(from, to)
	peak := float64(MaxInWindow(times, window))
	avg := float64(len(times)) / (to.Sub(from).Seconds() / window.Seconds())
	b.ReportMetric(float64(d.Connects)/secs, "connects/s")
	b.ReportMetric(float64(d.DNSQueries)/secs, "dns-queries/s")
	b.ReportMetric(float64(d.DNSQueries)/n/(secs/DefaultDNSTTL.Seconds()), "dns-queries/agent/ttl")
	b.ReportMetric(peak, "dns-peak/100ms")
	b.ReportMetric(avg, "dns-avg/100ms")
	b.ReportMetric(peak/avg, "dns-peak/avg")
	refPeak := float64(MaxInWindow(refTimes, window))
	refAvg := float64(len(refTimes)) / (to.Sub(from).Seconds() / window.Seconds())
	b.ReportMetric(refPeak/refAvg, "ref-peak/avg")
	b.ReportMetric(float64(stall.Milliseconds()), "max-stall-ms")
	b.ReportMetric(float64(d.TokenReviews)/secs, "reviews/s")
	b.ReportMetric(secs, "s-watched")
	b.ReportMetric(0, "ns/op")
	b.Logf("steady %.0f s: %v", secs, d)
}

// reference is BenchmarkSteady's baseline: n timers, each firing every
// period from a random phase, and a ticker that notes how late it runs.
type reference struct {
	mu      sync.Mutex // guards the fields below
	times   []time.Time
	timers  []*time.Timer
	stopped bool
	stall   time.Duration

	cancel context.CancelFunc
	done   chan struct{}
}

func startReference(n int, period time.Duration) *reference {
	r := &reference{done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	for range n {
		next := time.Now().Add(rand.N(period))
		var t *time.Timer
		t = time.AfterFunc(time.Until(next), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.stopped {
				return
			}
			r.times = append(r.times, time.Now())
			next = next.Add(period)
			t.Reset(time.Until(next))
		})
		r.timers = append(r.timers, t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		const tick = 10 * time.Millisecond
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-ticker.C:
				r.mu.Lock()
				r.stall = max(r.stall, now.Sub(last)-tick)
				r.mu.Unlock()
				last = now
			}
		}
	}()
	return r
}

// stop stops the timers and the ticker and returns when the timers fired,
// sorted, and the ticker's longest delay.
func (r *reference) stop() ([]time.Time, time.Duration) {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, t := range r.timers {
		t.Stop()
	}
	slices.SortFunc(r.times, func(a, b time.Time) int { return a.Compare(b) })
	return r.times, r.stall
}

// cpuTime returns the CPU time, user and system, the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// openFiles counts the process's open files.
func openFiles(b *testing.B) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		b.Logf("count open files: %v", err)
		return 0
	}
	return len(ents)
}
