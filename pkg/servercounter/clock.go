package servercounter

import (
	"context"
	"time"
)

// Clock tells the time and runs functions after a delay. The cache's
// expiry, the refresh timeout, the DNS counter's per-query timeout and its
// back-off all take time from one, so that a test can step time instead of
// waiting for it. A nil Clock in a configuration means the real one.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// the returned Timer is stopped first, as [time.AfterFunc] does.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending call made by [Clock.AfterFunc].
type Timer interface {
	// Stop prevents the call, and reports whether it did: false means
	// the call has already been made or the timer was stopped before.
	Stop() bool
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// orReal returns clk, or the real clock when clk is nil.
func orReal(clk Clock) Clock {
	if clk == nil {
		return realClock{}
	}
	return clk
}

// withTimeout is [context.WithTimeout] on clk: the returned context ends
// with cause when d has passed on clk, or when ctx ends.
func withTimeout(ctx context.Context, clk Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.AfterFunc(d, func() { cancel(cause) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// backoffTimer adapts a Clock to the timer that cenkalti/backoff waits on.
type backoffTimer struct {
	clk Clock
	c   chan time.Time
	t   Timer
}

func newBackoffTimer(clk Clock) *backoffTimer {
	return &backoffTimer{clk: clk, c: make(chan time.Time, 1)}
}

func (b *backoffTimer) Start(d time.Duration) {
	b.t = b.clk.AfterFunc(d, func() {
		select {
		case b.c <- b.clk.Now():
		default:
		}
	})
}

func (b *backoffTimer) Stop() {
	if b.t != nil {
		b.t.Stop()
	}
}

func (b *backoffTimer) C() <-chan time.Time { return b.c }
