// Package outage logs a failure that keeps a binary from doing its job at
// the default log level, once when it starts and once when it ends, rather
// than once per retry: an operator running with no -v flag sees that the
// agent cannot reach its servers, and when it can again, without a line
// every second.
package outage

import (
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
)

const (
	// DefaultRemind is how often a failure that goes on is logged again,
	// so that a log that was rotated or read late still shows it.
	DefaultRemind = 5 * time.Minute
	// DefaultQuiet is the least time between the start of one logged
	// failure and the next: attempts that fail and succeed in turn (one
	// bad server behind a load balancer) log a start and an end, then
	// nothing until DefaultQuiet has passed, not two lines per attempt.
	DefaultQuiet = time.Minute
)

// Outage tracks one kind of failure, e.g. "connect to proxy-server". It is
// safe for concurrent use. Build one with [New].
type Outage struct {
	what   string
	remind time.Duration
	quiet  time.Duration
	clk    clock.Clock

	mu sync.Mutex // guards the fields below
	// since is when the failure started; zero while there is none.
	since time.Time
	// announced is set when the failure going on was logged; its end is
	// logged only then.
	announced bool
	// logged is when a failure was last logged; zero before the first.
	logged time.Time
	// failures counts failed attempts since the failure started.
	failures int
}

// New returns an Outage of what ("connect to proxy-server"), read by the
// messages it logs, on clk (nil: the real clock).
func New(what string, clk clock.Clock) *Outage {
	return &Outage{what: what, remind: DefaultRemind, quiet: DefaultQuiet, clk: clock.Or(clk)}
}

// Failed records a failed attempt. The first of a run of failures is
// logged at error level (unless another was less than DefaultQuiet ago:
// then once DefaultQuiet has passed); while it goes on, it is logged again
// every DefaultRemind.
func (o *Outage) Failed(logger klog.Logger, err error, keysAndValues ...any) {
	o.mu.Lock()
	now := o.clk.Now()
	o.failures++
	if o.since.IsZero() {
		o.since = now
	}
	start := !o.announced && (o.logged.IsZero() || now.Sub(o.logged) >= o.quiet)
	remind := o.announced && now.Sub(o.logged) >= o.remind
	if start || remind {
		o.logged, o.announced = now, true
	}
	since, failures := o.since, o.failures
	o.mu.Unlock()
	logger = logger.WithCallDepth(1) // the line of the caller, not this one
	switch {
	case start:
		logger.Error(err, "Failed to "+o.what+"; retrying, and logging again when it recovers", keysAndValues...)
	case remind:
		logger.Error(err, "Still failing to "+o.what, append(keysAndValues, "failingFor", now.Sub(since).Round(time.Second).String(), "failures", failures)...)
	}
}

// Recovered records a success: if a failure that was logged was going on,
// its end is logged at level 0.
func (o *Outage) Recovered(logger klog.Logger, keysAndValues ...any) {
	o.mu.Lock()
	failingFor, failures, announced := o.clk.Now().Sub(o.since), o.failures, o.announced
	o.since, o.failures, o.announced = time.Time{}, 0, false
	o.mu.Unlock()
	if announced {
		logger.WithCallDepth(1).Info("Recovered: "+o.what+" succeeded again", append(keysAndValues, "failingFor", failingFor.Round(time.Millisecond).String(), "failures", failures)...)
	}
}
