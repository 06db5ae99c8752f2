package servercounter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// waitFor is the deadline for conditions in these tests; they normally hold
// within milliseconds.
const waitFor = 10 * time.Second

// gatedSource is a Counter whose answers a test hands out one at a time, so
// that it can hold a refresh in flight.
type gatedSource struct {
	calls   atomic.Int32
	answers chan answerOrErr
}

type answerOrErr struct {
	res servercounter.Result
	err error
}

// counterFunc adapts a function to a Counter.
type counterFunc func(ctx context.Context) (servercounter.Result, error)

func (f counterFunc) Count(ctx context.Context) (servercounter.Result, error) { return f(ctx) }

func newGatedSource() *gatedSource { return &gatedSource{answers: make(chan answerOrErr)} }

func (s *gatedSource) Count(ctx context.Context) (servercounter.Result, error) {
	s.calls.Add(1)
	select {
	case a := <-s.answers:
		return a.res, a.err
	case <-ctx.Done():
		return servercounter.Result{}, ctx.Err()
	}
}

// give hands out one answer, failing the test if no refresh asks for it.
func (s *gatedSource) give(t *testing.T, n int, err error) {
	t.Helper()
	a := answerOrErr{res: servercounter.Result{Count: n, Found: n, Source: servercounter.SourceDNS}, err: err}
	select {
	case s.answers <- a:
	case <-time.After(waitFor):
		t.Fatalf("no refresh asked for count %d", n)
	}
}

// newCache returns a cache of src on a manual clock, which cfg.Clock is set
// to, so that expiry passes only when the test steps the clock.
func newCache(t *testing.T, src servercounter.Counter, cfg servercounter.CacheConfig) (*servercounter.CachedServerCounter, *clocktest.Clock) {
	t.Helper()
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg.Clock = clk
	c, err := servercounter.NewCachedServerCounter(src, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c, clk
}

// expire waits until the cache has armed an expiry of exactly d, and
// moves clk past it. On a manual clock an armed timer is due in exactly
// its duration, so this also checks the expiry the cache chose.
func expire(t *testing.T, clk *clocktest.Clock, d time.Duration) {
	t.Helper()
	eventually(t, func() bool { next, ok := clk.Next(); return ok && next == d }, "an expiry of "+d.String())
	clk.Step(d)
}

// eventually waits until cond holds, failing after waitFor. Unlike
// require.Eventually it checks at once and then polls finely: most
// conditions here already hold or hold within microseconds, and a
// millisecond tick per wait was most of these tests' run time.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "condition not met within "+waitFor.String(), msg)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// The first calls of CountServers never wait for the first
// lookup (a nameserver that does not answer would hold every caller): they
// answer the fallback at once, and one refresh runs for all of them.
func TestCachedFirstCallsAnswerTheFallbackAtOnce(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, _ := newCache(t, src, servercounter.CacheConfig{Expiry: time.Hour, Fallback: 2, RefreshOnRead: true, ExactExpiry: true})
	var wg sync.WaitGroup
	got := make([]int, 50)
	for i := range got {
		wg.Go(func() { got[i] = c.CountServers() })
	}
	wg.Wait() // before the source answers: nobody waited for it
	for _, n := range got {
		assert.Equal(t, 2, n)
	}
	src.give(t, 3, nil)
	eventually(t, func() bool { return c.CountServers() == 3 }, "the count once the source answered")
	assert.Equal(t, int32(1), src.calls.Load(), "one refresh for all first callers")
}

func TestCachedFallbackBeforeFirstSuccess(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, clk := newCache(t, src, servercounter.CacheConfig{Fallback: 2, MinExpiry: time.Second, MaxExpiry: time.Hour, RefreshOnRead: true, ExactExpiry: true})
	assert.Equal(t, 2, c.CountServers())
	src.give(t, 0, errors.New("dns down"))
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, servercounter.SourceFallback, res.Source)

	// A failure waits MinExpiry before the next refresh; then a read asks
	// again and learns the count.
	expire(t, clk, time.Second)
	assert.Equal(t, 2, c.CountServers())
	src.give(t, 4, nil)
	eventually(t, func() bool { return c.CountServers() == 4 }, "count 4 after the refresh")
	assert.Equal(t, int32(2), src.calls.Load())
}

func TestCachedStaleWhileRevalidate(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, clk := newCache(t, src, servercounter.CacheConfig{Expiry: time.Minute, RefreshOnRead: true, ExactExpiry: true})
	go c.CountServers()
	src.give(t, 3, nil)
	eventually(t, func() bool { return c.CountServers() == 3 }, "first count")
	for range 100 {
		c.CountServers()
	}
	assert.Equal(t, int32(1), src.calls.Load(), "no refresh while the count is fresh")

	// After expiry, reads ask for one refresh; while it is in flight they
	// answer the last count.
	expire(t, clk, time.Minute)
	assert.Equal(t, 3, c.CountServers())
	eventually(t, func() bool { return src.calls.Load() == 2 }, "a refresh after expiry")
	for i := range 1000 {
		// A plain comparison: a thousand assert.Equal calls cost more
		// under the race detector than the rest of the test.
		if n := c.CountServers(); n != 3 {
			t.Fatalf("read %d during the refresh: %d servers, want the last count, 3", i, n)
		}
	}
	assert.Equal(t, int32(2), src.calls.Load(), "one refresh in flight, whatever the number of reads")
	src.give(t, 5, nil)
	eventually(t, func() bool { return c.CountServers() == 5 }, "the refreshed count")
}

func TestCachedKeepsLastGoodOnError(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	var observed atomic.Int32
	c, clk := newCache(t, src, servercounter.CacheConfig{Expiry: time.Minute, MinExpiry: time.Second,
		Observe: func(servercounter.Result, error) { observed.Add(1) }, RefreshOnRead: true, ExactExpiry: true})
	go c.CountServers()
	src.give(t, 3, nil)
	eventually(t, func() bool { return c.CountServers() == 3 }, "first count")
	for i, wait := range []time.Duration{time.Minute, time.Second, 2 * time.Second} {
		// A good count lives Expiry; after a failure the next try waits
		// MinExpiry, then twice as long after each failure in a row.
		expire(t, clk, wait)
		assert.Equal(t, 3, c.CountServers())
		src.give(t, 0, errors.New("servfail"))
		eventually(t, func() bool { return observed.Load() == int32(i+2) }, "the failed refresh observed")
		assert.Equal(t, 3, c.CountServers())
	}
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, servercounter.SourceDNS, res.Source)
	assert.Equal(t, 3, res.Count)
}

func TestCachedSingleFlightUnderLoad(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	src := counterFunc(func(ctx context.Context) (servercounter.Result, error) {
		calls.Add(1)
		<-release
		return servercounter.Result{Count: 7, Source: servercounter.SourceDNS}, nil
	})
	c, _ := newCache(t, src, servercounter.CacheConfig{Expiry: time.Hour, RefreshOnRead: true, ExactExpiry: true})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.CountServers()
			}
		})
	}
	eventually(t, func() bool { return calls.Load() == 1 }, "the first refresh starts")
	close(release)
	wg.Wait()
	eventually(t, func() bool { return c.CountServers() == 7 }, "the count once the source answered")
	assert.Equal(t, int32(1), calls.Load())
}

func TestCachedExpiryFollowsTTLWithinBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ttl  time.Duration
		cfg  servercounter.CacheConfig
		want time.Duration
	}{
		{name: "ttl within bounds", ttl: 5 * time.Second, cfg: servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Minute, RefreshOnRead: true, ExactExpiry: true}, want: 5 * time.Second},
		{name: "ttl above max", ttl: time.Hour, cfg: servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Minute, RefreshOnRead: true, ExactExpiry: true}, want: time.Minute},
		{name: "ttl below min", ttl: time.Millisecond, cfg: servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Minute, RefreshOnRead: true, ExactExpiry: true}, want: time.Second},
		{name: "fixed expiry ignores ttl", ttl: time.Hour, cfg: servercounter.CacheConfig{Expiry: 3 * time.Second, RefreshOnRead: true, ExactExpiry: true}, want: 3 * time.Second},
		{name: "defaults", ttl: 0, want: servercounter.DefaultMinExpiry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			src := counterFunc(func(ctx context.Context) (servercounter.Result, error) {
				calls.Add(1)
				return servercounter.Result{Count: 1, TTL: tc.ttl, Source: servercounter.SourceDNS}, nil
			})
			c, clk := newCache(t, src, tc.cfg)
			_, err := c.Count(t.Context()) // the first refresh
			require.NoError(t, err)
			for range 100 {
				c.CountServers()
			}
			assert.Equal(t, int32(1), calls.Load(), "one refresh while fresh")
			expire(t, clk, tc.want)
			c.CountServers()
			eventually(t, func() bool { return calls.Load() == 2 }, "a refresh once expired")
		})
	}
}

func TestCachedCountHonoursContext(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, _ := newCache(t, src, servercounter.CacheConfig{RefreshOnRead: true, ExactExpiry: true})
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	_, err := c.Count(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCachedCloseUnblocksFirstCall(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, err := servercounter.NewCachedServerCounter(src, servercounter.CacheConfig{Fallback: 2, RefreshOnRead: true, ExactExpiry: true})
	require.NoError(t, err)
	done := make(chan int)
	go func() { done <- c.CountServers() }()
	eventually(t, func() bool { return src.calls.Load() == 1 }, "the first refresh starts")
	require.NoError(t, c.Close())
	assert.Equal(t, 2, <-done)
	assert.Equal(t, 2, c.CountServers(), "a closed cache answers its last count")
}

func TestCachedRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := servercounter.NewCachedServerCounter(nil, servercounter.CacheConfig{Fallback: -1, MinExpiry: time.Hour, MaxExpiry: time.Second, RefreshOnRead: true, ExactExpiry: true})
	require.Error(t, err)
	for _, w := range []string{"no source", "invalid fallback count -1: must be positive (0 means the default, 1)", "invalid cache expiry"} {
		assert.Contains(t, err.Error(), w)
	}
}

func TestCachedDNSFollowsScaling(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2", "10.0.0.3")...)
	// One try per refresh: the cache's handling of failures is under
	// test here, not the counter's retries.
	dc := newCounter(t, srv, "_agent._tcp."+svc, func(c *servercounter.Config) { c.Attempts = 1 })
	var failed atomic.Int32
	c, clk := newCache(t, dc, servercounter.CacheConfig{Expiry: time.Minute, MinExpiry: time.Second,
		Observe: func(_ servercounter.Result, err error) {
			if err != nil {
				failed.Add(1)
			}
		}, RefreshOnRead: true, ExactExpiry: true})
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, res.Count)

	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")...)
	expire(t, clk, time.Minute)
	c.CountServers()
	eventually(t, func() bool { return c.CountServers() == 5 }, "scale up to 5")

	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	expire(t, clk, time.Minute)
	for i := range 3 {
		c.CountServers()
		eventually(t, func() bool { return failed.Load() == int32(i+1) }, "a failed refresh")
		assert.Equal(t, 5, c.CountServers(), "a DNS outage keeps the last count")
		expire(t, clk, time.Second<<i) // the back-off doubles

	}

	srv.ClearFault()
	srv.SetRecords()
	c.CountServers()
	eventually(t, func() bool { return c.CountServers() == 0 }, "NXDOMAIN counts zero")
}

func TestStaticServerCounter(t *testing.T) {
	t.Parallel()
	var c servercounter.ServerCounter = servercounter.StaticServerCounter(3)
	assert.Equal(t, 3, c.CountServers())
	res, err := servercounter.StaticServerCounter(3).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, servercounter.Result{Count: 3, Found: 3, Source: servercounter.SourceStatic}, res)
}

func TestCachedBackgroundRefreshSignalsChanges(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1")...)
	dc := newCounter(t, srv, svc)
	c, clk := newCache(t, dc, servercounter.CacheConfig{Expiry: time.Minute, ExactExpiry: true})

	// Nobody reads: the background refresh alone must notice each change.
	for _, n := range []int{1, 3, 2} {
		ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}[:n]
		ch := c.Changed()
		srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, ips...)...)
		if n != 1 {
			expire(t, clk, time.Minute)
			select {
			case <-ch:
			case <-time.After(waitFor):
				t.Fatalf("no change signalled for %d servers", n)
			}
		}
		eventually(t, func() bool { res, _ := c.Count(t.Context()); return res.Count == n }, "the new count")
	}
}

// By default, caches started together draw their first expiry between
// MinExpiry and the TTL, and every later one from the TTL's last fifth,
// so that they never refresh in step.
func TestCachedSpreadsEveryExpiry(t *testing.T) {
	t.Parallel()
	const (
		ttl = 10 * time.Second
		// The draws are uniform over billions of nanoseconds, so five
		// caches draw five different expiries but about once in a
		// billion runs; a draw that is not spread, or spread over a few
		// values only, fails.
		caches = 5
	)
	firsts, seconds := map[time.Duration]bool{}, map[time.Duration]bool{}
	for range caches {
		var calls atomic.Int32
		src := counterFunc(func(context.Context) (servercounter.Result, error) {
			calls.Add(1)
			return servercounter.Result{Count: 1, TTL: ttl, Source: servercounter.SourceDNS}, nil
		})
		c, clk := newCache(t, src, servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Minute, RefreshOnRead: true})
		c.CountServers()
		for i, seen := range []map[time.Duration]bool{firsts, seconds} {
			var next time.Duration
			eventually(t, func() bool { d, ok := clk.Next(); next = d; return ok }, "an expiry")
			low := time.Second // the first: from MinExpiry
			if i > 0 {
				low = ttl - ttl/5
			}
			require.GreaterOrEqual(t, next, low, "expiry %d too early", i+1)
			require.LessOrEqual(t, next, ttl, "expiry %d after the TTL", i+1)
			seen[next] = true
			clk.Step(next)
			c.CountServers()
			eventually(t, func() bool { return calls.Load() == int32(i+2) }, "a refresh once expired")
		}
	}
	assert.Len(t, firsts, caches, "%d caches drew first expiries %v: not spread", caches, firsts)
	assert.Len(t, seconds, caches, "%d caches drew second expiries %v: not spread", caches, seconds)
}

// Failed refreshes in a row wait MinExpiry, then twice as long
// each time up to RetryMax; a success resets the wait. Backoff says how
// long the wait is and when it ends.
func TestCachedBacksOffAfterFailures(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, clk := newCache(t, src, servercounter.CacheConfig{Expiry: time.Minute, MinExpiry: time.Second, RetryMax: 10 * time.Second, RefreshOnRead: true, ExactExpiry: true})
	go c.CountServers()
	src.give(t, 3, nil)
	eventually(t, func() bool { return c.CountServers() == 3 }, "first count")
	wait, _ := c.Backoff()
	assert.Zero(t, wait, "no back-off after a success")

	expire(t, clk, time.Minute)
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second} {
		c.CountServers()
		src.give(t, 0, errors.New("servfail"))
		eventually(t, func() bool { w, _ := c.Backoff(); return w == want }, "a back-off of "+want.String())
		_, until := c.Backoff()
		assert.Equal(t, clk.Now().Add(want), until)
		assert.Equal(t, 3, c.CountServers(), "the last good count stays")
		expire(t, clk, want)
	}
	c.CountServers()
	src.give(t, 4, nil)
	eventually(t, func() bool { return c.CountServers() == 4 }, "the count after the outage")
	wait, _ = c.Backoff()
	assert.Zero(t, wait)
	expire(t, clk, time.Minute)
	c.CountServers()
	src.give(t, 0, errors.New("servfail"))
	eventually(t, func() bool { w, _ := c.Backoff(); return w == time.Second }, "a success resets the back-off")
}

// By default each wait after a failure is drawn from the upper half of
// its step: never longer than the step, never shorter than half, and
// spread.
func TestCachedBackOffIsJittered(t *testing.T) {
	t.Parallel()
	src := newGatedSource()
	c, clk := newCache(t, src, servercounter.CacheConfig{Expiry: time.Minute, MinExpiry: time.Second, RetryMax: 8 * time.Second, RefreshOnRead: true})
	go c.CountServers()
	src.give(t, 3, nil)
	eventually(t, func() bool { return c.CountServers() == 3 }, "first count")
	waits := map[time.Duration]bool{}
	step := time.Second
	for range 8 {
		var next time.Duration
		eventually(t, func() bool { d, ok := clk.Next(); next = d; return ok }, "a timer")
		clk.Step(next)
		c.CountServers()
		src.give(t, 0, errors.New("servfail"))
		var w time.Duration
		eventually(t, func() bool { w, _ = c.Backoff(); return w > 0 && !waits[w] }, "a new back-off")
		require.GreaterOrEqual(t, w, step/2)
		require.LessOrEqual(t, w, step)
		waits[w] = true
		step = min(2*step, 8*time.Second)
	}
}

// Behind a caching resolver the TTL of each answer counts down to the
// cache entry's expiry. The period follows a lower TTL by a tenth at a
// time only, so that caches that follow the countdown do not all expire
// with the entry; a higher TTL applies at once.
func TestCachedHoldsThePeriodAgainstACountdown(t *testing.T) {
	t.Parallel()
	var ttl atomic.Int64
	ttl.Store(int64(10 * time.Second))
	var calls atomic.Int32
	src := counterFunc(func(context.Context) (servercounter.Result, error) {
		calls.Add(1)
		return servercounter.Result{Count: 1, TTL: time.Duration(ttl.Load()), Source: servercounter.SourceDNS}, nil
	})
	c, clk := newCache(t, src, servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Minute, RefreshOnRead: true, ExactExpiry: true})
	c.CountServers()
	eventually(t, func() bool { return calls.Load() == 1 }, "the first refresh")
	for i, want := range []time.Duration{10 * time.Second, 9 * time.Second, 8100 * time.Millisecond, 10 * time.Second} {
		switch i {
		case 0:
			ttl.Store(int64(2 * time.Second)) // answers of a cache entry near its end
		case 2:
			ttl.Store(int64(10 * time.Second)) // a fresh entry
		}
		expire(t, clk, want)
		c.CountServers()
		eventually(t, func() bool { return calls.Load() == int32(i+2) }, "a refresh")
	}
}

// Refresh asks for a refresh at once when the last one ended
// MinExpiry ago or more, else as soon as MinExpiry has passed; a burst of
// asks is one refresh, and a cache backing off after a failure keeps its
// back-off. A MaxCounter passes the ask on.
func TestCachedRefreshOnAsk(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var fail atomic.Bool
	src := counterFunc(func(context.Context) (servercounter.Result, error) {
		calls.Add(1)
		if fail.Load() {
			return servercounter.Result{}, errors.New("servfail")
		}
		return servercounter.Result{Count: 3, TTL: time.Minute, Source: servercounter.SourceDNS}, nil
	})
	c, clk := newCache(t, src, servercounter.CacheConfig{MinExpiry: time.Second, MaxExpiry: time.Hour, ExactExpiry: true})
	eventually(t, func() bool { return calls.Load() == 1 }, "the first refresh")
	m := servercounter.NewMaxCounter(c)
	t.Cleanup(func() { _ = m.Close() })

	// Asked right after a refresh: not before MinExpiry.
	for range 5 {
		m.Refresh()
	}
	expire(t, clk, time.Second)
	eventually(t, func() bool { return calls.Load() == 2 }, "a refresh MinExpiry after the last")

	// Asked later than MinExpiry after the last: at once.
	clk.Step(2 * time.Second)
	c.Refresh()
	eventually(t, func() bool { return calls.Load() == 3 }, "a refresh at once")

	// Backing off after a failure: the ask waits for the back-off.
	fail.Store(true)
	clk.Step(2 * time.Second)
	c.Refresh()
	eventually(t, func() bool { w, _ := c.Backoff(); return w == time.Second }, "a failed refresh")
	for range 3 {
		c.Refresh() // returns without asking the refresh loop anything
	}
	assert.Equal(t, int32(4), calls.Load(), "asks during a back-off made refreshes")
	expire(t, clk, time.Second) // the back-off's timer
	eventually(t, func() bool { return calls.Load() == 5 }, "the retry after the back-off")
}
