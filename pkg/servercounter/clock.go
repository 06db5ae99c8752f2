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

// RealClock is the wall clock: what a nil Clock in a configuration means.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// orReal returns clk, or the real clock when clk is nil.
func orReal(clk Clock) Clock {
	if clk == nil {
		return RealClock{}
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

// alarm is a channel that receives once when its time has passed on a
// Clock.
type alarm struct {
	C <-chan struct{}
	t Timer
}

// after returns an alarm that goes off once d has passed on clk.
func after(clk Clock, d time.Duration) alarm {
	c := make(chan struct{}, 1) // the call never blocks
	return alarm{C: c, t: clk.AfterFunc(d, func() { c <- struct{}{} })}
}

// Stop prevents the alarm, if it has not gone off.
func (a alarm) Stop() { a.t.Stop() }
