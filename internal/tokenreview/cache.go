package tokenreview

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"
)

// review is one TokenReview that callers wait for.
type review struct {
	done chan struct{} // closed once node and err are set
	node string        // the node the token is bound to, "" for none
	err  error
	// cancelWait ends the review's wait for the rate limit and a slot,
	// not the request once sent, and cancel the whole review.
	cancelWait, cancel context.CancelFunc
	// waiters counts the callers waiting for it; the last to leave
	// cancels its wait, unless sent is set: it has its slot and is
	// asking. Both guarded by Authenticator.mu.
	waiters int
	sent    bool
}

// verdict is a cached review: err is nil for an accepted token, which
// is bound to node ("" for none).
type verdict struct {
	node  string
	err   error
	until time.Time
}

// join returns the review of key that is under way, or starts one, and
// counts the caller as waiting for it; or, with a nil review, the verdict
// that a review which ended since the caller looked at the cache left
// there (a review is remembered before it leaves a.reviews, so a caller
// finds one or the other, unless its verdict was not cached: an API
// server error or a full cache, and the caller starts a review). Callers that share a review do not
// share a context: the review runs on its own, bounded by ReviewTimeout.
// It waits for the rate limit and a slot for as long as any of them
// waits; once sent, it runs to the answer, and holds its slot until then,
// whoever still waits: the API server goes on with a request whose
// client hung up, so a slot freed at once would let more than
// MaxInFlight run there at once. Its verdict is cached for a caller who
// comes back.
func (a *Authenticator) join(key [sha256.Size]byte, token string) (*review, verdict, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reviews[key]
	if r == nil {
		if v, ok := a.cachedLocked(key); ok {
			return nil, v, nil
		}
		if a.pending >= a.cfg.MaxInFlight+a.cfg.MaxQueued {
			a.metrics.overloaded.Inc()
			return nil, verdict{}, ErrOverloaded
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ReviewTimeout)
		waitCtx, cancelWait := context.WithCancel(ctx)
		r = &review{done: make(chan struct{}), cancelWait: cancelWait, cancel: cancel}
		a.reviews[key] = r
		a.pending++
		a.metrics.pending.Set(float64(a.pending))
		go a.run(waitCtx, ctx, key, token, r)
	}
	r.waiters++
	return r, verdict{}, nil
}

// leave counts a caller that stopped waiting for r. The last one ends its
// wait for the rate limit and a slot; a review already sent goes on, and
// a caller who comes back joins it.
func (a *Authenticator) leave(key [sha256.Size]byte, r *review) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.waiters--; r.waiters == 0 && !r.sent {
		r.cancelWait()
		if a.reviews[key] == r {
			delete(a.reviews, key) // a new caller starts afresh
		}
	}
}

// run carries out review r of token, waiting for the rate limit and a
// slot under waitCtx and asking under ctx, and remembers its verdict.
func (a *Authenticator) run(waitCtx, ctx context.Context, key [sha256.Size]byte, token string, r *review) {
	r.node, r.err = a.review(waitCtx, ctx, token, r)
	if ctx.Err() == nil || r.err == nil {
		a.remember(key, token, r.node, r.err)
	}
	r.cancel()
	a.mu.Lock()
	if a.reviews[key] == r {
		delete(a.reviews, key)
	}
	a.pending--
	a.metrics.pending.Set(float64(a.pending))
	a.mu.Unlock()
	close(r.done)
}

// cached returns the cached verdict on key, if one is still valid.
func (a *Authenticator) cached(key [sha256.Size]byte) (verdict, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cachedLocked(key)
}

// cachedLocked is cached with a.mu held.
func (a *Authenticator) cachedLocked(key [sha256.Size]byte) (verdict, bool) {
	v, ok := a.cache[key]
	if ok && !a.cfg.Clock.Now().Before(v.until) {
		delete(a.cache, key)
		a.metrics.entries.Set(float64(len(a.cache)))
		return verdict{}, false
	}
	return v, ok
}

// remember caches the verdict err on token: an acceptance until CacheTTL
// or the token's expiry, a refusal for DenialTTL. An API server error is
// not a verdict and is not cached.
func (a *Authenticator) remember(key [sha256.Size]byte, token, node string, err error) {
	now := a.cfg.Clock.Now()
	var until time.Time
	switch {
	case err == nil:
		until = now.Add(a.cfg.CacheTTL)
		if exp, ok := expiry(token); ok && exp.Before(until) {
			until = exp
		}
	case errors.Is(err, errDenied):
		until = now.Add(a.cfg.DenialTTL)
	default:
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= a.cfg.MaxEntries {
		for k, v := range a.cache {
			if !now.Before(v.until) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= a.cfg.MaxEntries {
			return // full of live verdicts: review again rather than grow
		}
	}
	a.cache[key] = verdict{node: node, err: err, until: until}
	a.metrics.entries.Set(float64(len(a.cache)))
}
