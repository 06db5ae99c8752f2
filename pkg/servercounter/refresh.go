package servercounter

import (
	"context"
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"
)

// run is the refresh loop: one refresh at a time, for as long as ctx.
func (c *CachedServerCounter) run(ctx context.Context) {
	defer close(c.done)
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.refresh:
		}
		// Reads during a refresh leave a request behind; the count it
		// asked for may be fresh by now.
		if c.cur.Load().stale {
			c.refreshOnce(ctx)
		}
		if first {
			close(c.ready)
			first = false
		}
	}
}

func (c *CachedServerCounter) refreshOnce(ctx context.Context) {
	rctx, cancel := withTimeout(ctx, c.cfg.Clock, c.cfg.RefreshTimeout, errRefreshTimeout)
	res, err := c.source.Count(rctx)
	cancel()
	if c.cfg.Observe != nil {
		c.cfg.Observe(res, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	var wait time.Duration
	if err != nil {
		klog.FromContext(ctx).V(4).Info("Server count refresh failed, keeping the last count", "err", err)
		wait = c.retryWaitLocked()
	} else {
		wait = c.expiryLocked(res)
	}
	e := c.publish(klog.FromContext(ctx))
	c.refreshed = c.cfg.Clock.Now()
	c.armLocked(e, wait)
}

// armLocked arms the expiry of e in wait. c.mu must be held.
func (c *CachedServerCounter) armLocked(e *entry, wait time.Duration) {
	if c.expiry != nil {
		c.expiry.Stop()
	}
	c.expiresAt = c.cfg.Clock.Now().Add(wait)
	c.expiry = c.cfg.Clock.AfterFunc(wait, func() { c.expire(e) })
}

// Refresh asks for a refresh as soon as the cache's limits allow,
// through the same single flight as every other: at once, or MinExpiry
// after the last refresh ended if that is later, and not before its
// back-off ends if the last refresh failed. An agent calls it when a
// server it held goes away or a listed address fails, so that a server
// replaced at a new address is dialled within seconds of its record,
// not a TTL later; a burst of calls is one refresh.
func (c *CachedServerCounter) Refresh() {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.cur.Load()
	if c.closed || c.retryWait > 0 || c.good == nil {
		return // closed, backing off, or the first refresh is on its way
	}
	due := c.refreshed.Add(c.cfg.MinExpiry)
	if !e.stale && due.Before(c.expiresAt) {
		if wait := due.Sub(c.cfg.Clock.Now()); wait > 0 {
			c.armLocked(e, wait)
			return
		}
		c.set(&entry{count: e.count, stale: true, result: e.result})
	}
	select {
	case c.refresh <- struct{}{}:
	default: // a refresh is asked for already
	}
}

// retryWaitLocked returns the wait after a failed refresh: the next step
// of the back-off, drawn from its upper half. c.mu must be held.
func (c *CachedServerCounter) retryWaitLocked() time.Duration {
	ceiling := c.retry.NextBackOff()
	wait := ceiling
	if !c.cfg.ExactExpiry {
		// Equal jitter, not full: a wait drawn from [0, ceiling] would
		// average a quarter of RetryMax, and a fleet at the cap would ask
		// a failing DNS twice as often for nothing.
		wait = ceiling - rand.N(ceiling/2+1)
	}
	c.retryWait, c.retryUntil = wait, c.cfg.Clock.Now().Add(wait)
	return wait
}

// expiryLocked keeps res as the good result and returns how long it is
// fresh. c.mu must be held.
//
// The period follows the source's TTL within the bounds, but a TTL below
// the period seen so far lowers it by a tenth at a time only: behind a
// caching resolver (CoreDNS's cache, NodeLocal DNSCache) each answer
// carries what is left of the cache entry's TTL, and a fleet that took
// those as its expiries would all refresh when the entry expires, in
// step. A TTL that really went down is followed within a few periods.
// Each expiry is then drawn from the last fifth of the period (the
// first, for caches started together, from MinExpiry up), so that phases
// drift apart and never lock together: about 11% more refreshes than
// exact expiries would make.
func (c *CachedServerCounter) expiryLocked(res Result) time.Duration {
	first := c.good == nil
	c.good = &res
	c.retry.Reset()
	c.retryWait, c.retryUntil = 0, time.Time{}
	ttl := c.cfg.Expiry
	if ttl == 0 {
		ttl = min(max(res.TTL, c.cfg.MinExpiry), c.cfg.MaxExpiry)
	}
	if first || c.cfg.Expiry != 0 {
		c.period = ttl
	} else {
		c.period = max(ttl, c.period-c.period/10)
	}
	switch {
	case c.cfg.ExactExpiry:
		return c.period
	case first:
		return c.cfg.MinExpiry + rand.N(max(c.period-c.cfg.MinExpiry, 0)+1)
	default:
		return c.period - rand.N(c.period/5+1)
	}
}

// Backoff reports whether the last refresh failed, and if so how long
// the cache waits before the next one and when that wait ends: what the
// metrics and `servercount explain` say of a count that is backing off.
func (c *CachedServerCounter) Backoff() (wait time.Duration, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retryWait, c.retryUntil
}

// expire marks e stale, unless a newer count replaced it, and asks for a
// refresh (with RefreshOnRead, it leaves that to the next read).
func (c *CachedServerCounter) expire(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.cur.Load() != e {
		return
	}
	c.set(&entry{count: e.count, stale: true, result: e.result})
	if !c.cfg.RefreshOnRead {
		select {
		case c.refresh <- struct{}{}:
		default:
		}
	}
}
