package servercounter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
)

// Defaults for the zero values of [CacheConfig].
const (
	// DefaultMinExpiry is the shortest time a count stays fresh, and the
	// first wait after a failed refresh before the next.
	DefaultMinExpiry = 1 * time.Second
	// DefaultRetryMax caps the wait between failed refreshes.
	DefaultRetryMax = 30 * time.Second
	// DefaultMaxExpiry is the longest time a count stays fresh.
	DefaultMaxExpiry = 30 * time.Second
	// DefaultFallback is the count answered before the first success.
	DefaultFallback = 1
	// defaultRefreshTimeout bounds one refresh.
	defaultRefreshTimeout = 10 * time.Second
)

// CacheConfig configures a [CachedServerCounter]. The zero value of each
// field means its default.
type CacheConfig struct {
	// Expiry is how long a count stays fresh. Zero means the TTL the
	// source reported (Result.TTL), bounded by MinExpiry and MaxExpiry.
	Expiry time.Duration
	// MinExpiry and MaxExpiry bound the source's TTL; defaults
	// DefaultMinExpiry and DefaultMaxExpiry. MinExpiry is also the first
	// wait after a failed refresh (see RetryMax).
	MinExpiry, MaxExpiry time.Duration
	// RetryMax caps the wait between failed refreshes: after each failure
	// in a row the wait doubles, from MinExpiry up to RetryMax, and is
	// drawn at random from the upper half of that (equal jitter), so that
	// a fleet whose DNS fails at once neither hammers it nor retries in
	// step. A success resets it. The last good count stays in use
	// meanwhile. Default DefaultRetryMax.
	RetryMax time.Duration
	// Fallback is the count answered before the first successful refresh;
	// default DefaultFallback.
	Fallback int
	// RefreshTimeout bounds one refresh, and so the first call's wait;
	// default 10s.
	RefreshTimeout time.Duration
	// RefreshOnRead refreshes an expired count only when it is next read.
	// By default the count is refreshed as soon as it expires, so that
	// [CachedServerCounter.Changed] fires soon after the source changes
	// even when nobody reads, at the cost of one refresh per expiry while
	// the cache is open.
	RefreshOnRead bool
	// ExactExpiry keeps every count for exactly its expiry, and waits
	// exactly each step of the back-off after a failure: for tests. By
	// default every wait is drawn at random, so that a fleet of caches
	// started together (agents after a rollout), or whose DNS came back
	// together, or behind one caching resolver whose answers count their
	// TTL down together, refreshes spread out instead of in step: the
	// first expiry between MinExpiry and its usual value, each later one
	// in the last fifth of its usual value (see refreshOnce), the waits
	// after failures as RetryMax says.
	ExactExpiry bool
	// Observe, when set, is called after each refresh with the source's
	// result and error, in the refresh goroutine and before the result is
	// published: metrics hook in here. It must return quickly.
	Observe func(Result, error)
	// Clock times expiry and the refresh timeout; nil means the real
	// clock.
	Clock clock.Clock
}

// CachedServerCounter caches the count of another [Counter].
//
// CountServers answers from one atomic load. The first refresh starts with
// the cache, and once the count has expired another starts at once (with
// CacheConfig.RefreshOnRead, at the next call); meanwhile calls answer the
// last count (stale-while-revalidate), and however many callers there are,
// one refresh runs at a time. A failed refresh keeps the last good
// count. Before the first success the cache answers CacheConfig.Fallback:
// CountServers never waits, and Count waits for the first refresh only as
// long as its context lets it.
//
// A CachedServerCounter is safe for concurrent use. Close stops it. The
// source must honour its context: RefreshTimeout bounds a refresh, and so
// the first call's wait and Close, only through it.
type CachedServerCounter struct {
	source Counter
	cfg    CacheConfig

	// cur is the count that readers see. Writers replace it through set,
	// holding mu; readers only Load it.
	cur atomic.Pointer[entry]
	// fast mirrors cur for CountServers: the count when fresh, -(count+1)
	// when stale. One integer load is cheaper than a pointer load and a
	// dereference, and keeps CountServers small enough to inline.
	fast atomic.Int64
	// refresh asks the refresh loop for a refresh. Its buffer of 1 and
	// non-blocking sends merge a burst of requests into one refresh.
	refresh chan struct{}
	// ready is closed when the first refresh has ended, well or not.
	ready chan struct{}
	// done is closed when the refresh loop has returned.
	done   chan struct{}
	cancel context.CancelFunc

	mu sync.Mutex // serialises writers; guards the fields below
	// good is the last good result; nil before the first.
	good *Result
	// period is how long a good count is fresh: the source's TTL within
	// the bounds, held against a caching resolver's countdown (see
	// refreshOnce).
	period time.Duration
	// retry gives the waits after failed refreshes in a row: the
	// ceilings, before jitter; reset by a success.
	retry *backoff.ExponentialBackOff
	// retryWait is the wait after the last refresh if it failed, zero
	// after a success; retryUntil is when that wait ends. For Backoff.
	retryWait  time.Duration
	retryUntil time.Time
	// refreshed is when the last refresh ended, and expiresAt when the
	// expiry timer armed then fires: for Refresh.
	refreshed, expiresAt time.Time
	// expiry marks cur stale when it fires.
	expiry clock.Timer
	closed bool
	// changed is closed, and replaced, when the published count changes.
	changed chan struct{}
}

// set publishes e. c.mu must be held, but for the first entry.
func (c *CachedServerCounter) set(e *entry) {
	c.cur.Store(e)
	v := int64(e.count)
	if e.stale {
		v = -v - 1
	}
	c.fast.Store(v)
}

// entry is a published count. It is never changed once published.
type entry struct {
	count  int
	stale  bool // a read should ask for a refresh
	result Result
}

// NewCachedServerCounter returns a cache in front of source.
func NewCachedServerCounter(source Counter, cfg CacheConfig) (*CachedServerCounter, error) {
	cfg.MinExpiry = cmp.Or(cfg.MinExpiry, DefaultMinExpiry)
	cfg.MaxExpiry = cmp.Or(cfg.MaxExpiry, DefaultMaxExpiry)
	cfg.Fallback = cmp.Or(cfg.Fallback, DefaultFallback)
	cfg.RefreshTimeout = cmp.Or(cfg.RefreshTimeout, defaultRefreshTimeout)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, max(DefaultRetryMax, cfg.MinExpiry))
	cfg.Clock = clock.Or(cfg.Clock)
	var errs []error
	if source == nil {
		errs = append(errs, errors.New("servercounter: no source to cache: pass a Counter such as a *DNSServerCounter"))
	}
	if cfg.Expiry < 0 || cfg.MinExpiry < 0 || cfg.MaxExpiry < cfg.MinExpiry {
		errs = append(errs, fmt.Errorf("servercounter: invalid cache expiry %v (min %v, max %v): want positive durations with min <= max", cfg.Expiry, cfg.MinExpiry, cfg.MaxExpiry))
	}
	if cfg.Fallback < 0 {
		errs = append(errs, fmt.Errorf("servercounter: invalid fallback count %d: must be positive (0 means the default, %d)", cfg.Fallback, DefaultFallback))
	}
	if cfg.RetryMax < cfg.MinExpiry {
		errs = append(errs, fmt.Errorf("servercounter: invalid retry cap %v: must be at least the minimum expiry %v, the first wait after a failure", cfg.RetryMax, cfg.MinExpiry))
	}
	if cfg.RefreshTimeout < 0 {
		errs = append(errs, fmt.Errorf("servercounter: invalid refresh timeout %v: must be positive", cfg.RefreshTimeout))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	ctx, cancel := context.WithCancel(context.Background())
	c := &CachedServerCounter{
		source:  source,
		cfg:     cfg,
		refresh: make(chan struct{}, 1),
		ready:   make(chan struct{}),
		done:    make(chan struct{}),
		cancel:  cancel,
		changed: make(chan struct{}),
		// The ceilings only: the jitter is drawn in refreshOnce, so that
		// a wait never passes RetryMax. MaxElapsedTime 0: the cache
		// retries until it is closed.
		retry: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(cfg.MinExpiry),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0),
			backoff.WithMaxInterval(cfg.RetryMax),
			backoff.WithMaxElapsedTime(0)),
	}
	c.set(&entry{count: cfg.Fallback, stale: true, result: c.fallback()})
	go c.run(ctx)
	if !cfg.RefreshOnRead {
		c.refresh <- struct{}{} // the buffer is empty: this never blocks
	}
	return c, nil
}

// CountServers returns the cached count, and never waits: before the
// first refresh has ended it answers CacheConfig.Fallback (and asks for
// the refresh, if none has started). A caller that would rather wait for
// the first count calls Count with a context that bounds the wait.
func (c *CachedServerCounter) CountServers() int {
	// Kept small enough to inline: a fresh read is one atomic load.
	if v := c.fast.Load(); v >= 0 {
		return int(v)
	}
	return c.countStale()
}

// countStale is kept out of line so that CountServers inlines.
//
//go:noinline
func (c *CachedServerCounter) countStale() int {
	select {
	case c.refresh <- struct{}{}:
	default: // a refresh is asked for already
	}
	return c.cur.Load().count
}

// Count returns the cached count with where it came from: Source is that of
// the last good result, or SourceFallback before the first.
// It fails only when ctx ends before the first refresh does.
func (c *CachedServerCounter) Count(ctx context.Context) (Result, error) {
	e := c.cur.Load()
	if e.stale {
		e = c.revalidate(ctx)
		if err := ctx.Err(); err != nil && !c.isReady() {
			return Result{}, err
		}
	}
	return e.result, nil
}

// revalidate asks for a refresh and, before the first refresh has ended,
// waits for it.
func (c *CachedServerCounter) revalidate(ctx context.Context) *entry {
	select {
	case c.refresh <- struct{}{}:
	default:
	}
	select {
	case <-c.ready:
	default:
		select {
		case <-c.ready:
		case <-c.done:
		case <-ctx.Done():
		}
	}
	return c.cur.Load()
}

func (c *CachedServerCounter) isReady() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// Close stops the refresh loop and waits for it to return. Later calls
// answer the last count.
func (c *CachedServerCounter) Close() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.expiry != nil {
		c.expiry.Stop()
	}
	if e := c.cur.Load(); e.stale {
		c.set(&entry{count: e.count, result: e.result})
	}
	return nil
}

var _ Refresher = (*CachedServerCounter)(nil)

// errRefreshTimeout ends a refresh that took longer than RefreshTimeout.
var errRefreshTimeout = errors.New("servercounter: refresh took longer than CacheConfig.RefreshTimeout")

// publish makes readers see the last good result, or the fallback before
// the first, and signals a change of count. c.mu must be held.
func (c *CachedServerCounter) publish(logger klog.Logger) *entry {
	e := &entry{count: c.cfg.Fallback, result: c.fallback()}
	if c.good != nil {
		e.count, e.result = c.good.Count, *c.good
	}
	if old := c.cur.Load(); old.count != e.count {
		logger.V(2).Info("Server count changed", "oldCount", old.count, "newCount", e.count, "source", e.result.Source.String(), "name", e.result.Name)
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.set(e)
	return e
}

// Changed returns a channel that is closed when the count changes. Call it
// again after each change for the next one. A watcher that must not miss a
// change calls Changed before it reads the count.
func (c *CachedServerCounter) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *CachedServerCounter) fallback() Result {
	return Result{Count: c.cfg.Fallback, Found: c.cfg.Fallback, Source: SourceFallback}
}

var _ Notifier = (*CachedServerCounter)(nil)
