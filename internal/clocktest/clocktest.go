// Package clocktest is a manual clock for tests of code that takes a
// [clock.Clock]: time moves only when the test steps it, so that
// expiry, timeouts, back-off and hold-downs are tested without waiting.
package clocktest

import (
	"slices"
	"sync"
	"time"

	"github.com/servercount/servercount/pkg/clock"
)

// Clock is a [clock.Clock] that moves only on [Clock.Step]. It is
// safe for concurrent use.
type Clock struct {
	mu     sync.Mutex // guards the fields below
	now    time.Time
	timers []*timer // pending, in no order
}

// New returns a clock that reads start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arranges for f to be called by the Step that moves the clock
// to or past now+d; d <= 0 means the next Step, even of zero.
func (c *Clock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Pending returns how many calls wait for their time.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next returns how far the clock must move for the earliest pending call
// to be due, and false if no call is pending.
func (c *Clock) Next() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	at := c.timers[0].at
	for _, t := range c.timers[1:] {
		if t.at.Before(at) {
			at = t.at
		}
	}
	return max(at.Sub(c.now), 0), true
}

// Step moves the clock d forward and makes every call that is due, in
// the order of their times, each in the caller's goroutine, with the
// clock reading its time. Calls that a due call arms are made in the same
// Step if they are due too.
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		i := -1
		for j, t := range c.timers {
			if !t.at.After(end) && (i < 0 || t.at.Before(c.timers[i].at)) {
				i = j
			}
		}
		if i < 0 {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.now = later(c.now, t.at)
		c.mu.Unlock()
		t.f()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

type timer struct {
	c  *Clock
	at time.Time
	f  func()
}

// Stop cancels the call, reporting whether it was still pending.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}
