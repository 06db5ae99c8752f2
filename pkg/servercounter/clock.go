package servercounter

import (
	"context"
	"time"

	"github.com/servercount/servercount/pkg/clock"
)

// withTimeout is [context.WithTimeout] on clk: the returned context ends
// with cause when d has passed on clk, or when ctx ends.
func withTimeout(ctx context.Context, clk clock.Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
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
	t clock.Timer
}

// after returns an alarm that goes off once d has passed on clk.
func after(clk clock.Clock, d time.Duration) alarm {
	c := make(chan struct{}, 1) // the call never blocks
	return alarm{C: c, t: clk.AfterFunc(d, func() { c <- struct{}{} })}
}

// Stop prevents the alarm, if it has not gone off.
func (a alarm) Stop() { a.t.Stop() }
