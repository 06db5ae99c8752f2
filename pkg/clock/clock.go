// Package clock is the time servercount's packages take. A Clock tells
// the time and runs functions after a delay: the count cache's expiry, the
// DNS counter's timeouts and back-off, the lease counter's expiry, the
// TokenReview cache, the agent's hold-down and the server's per-address
// buckets all take time from one, so that a test can step time instead
// of waiting for it. A nil Clock in a configuration means [Real].
package clock

import "time"

// Clock tells the time and runs functions after a delay.
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

// Real is the wall clock: what a nil Clock in a configuration means.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Monotonic turns a Clock's times into int64 readings that an
// atomic.Int64 can hold: nanoseconds since the Monotonic was made. Go
// subtracts two times of the real clock on its monotonic reading, so a
// step of the wall clock (NTP after a VM resumes, a clock set by hand)
// moves no reading: liveness checks that compare readings are neither
// fooled nor blinded by one. A reading is never 0, which callers keep
// for "not set". The zero Monotonic is not ready: use [NewMonotonic].
type Monotonic struct {
	c     Clock
	start time.Time
}

// NewMonotonic returns a Monotonic on c (nil: [Real]) that starts now.
func NewMonotonic(c Clock) Monotonic {
	c = Or(c)
	// A moment before now, so that no reading of a later Now is 0.
	return Monotonic{c: c, start: c.Now().Add(-time.Nanosecond)}
}

// Now returns the reading of now.
func (m Monotonic) Now() int64 { return m.Of(m.c.Now()) }

// Of returns the reading of t, a time of the same Clock.
func (m Monotonic) Of(t time.Time) int64 { return int64(t.Sub(m.start)) }
