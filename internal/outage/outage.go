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
)

// DefaultRemind is how often a failure that goes on is logged again, so
// that a log that was rotated or read late still shows it.
const DefaultRemind = 5 * time.Minute

// Outage tracks one kind of failure, e.g. "connect to proxy-server". It is
// safe for concurrent use. The zero value is not usable: build one with
// [New].
type Outage struct {
	what   string
	remind time.Duration
	now    func() time.Time

	mu sync.Mutex // guards the fields below
	// since is when the failure started; zero while there is none.
	since time.Time
	// logged is when the failure was last logged.
	logged time.Time
	// failures counts failed attempts since the failure started.
	failures int
}

// New returns an Outage of what ("connect to proxy-server"), read by the
// messages it logs. now is the clock; nil means time.Now.
func New(what string, now func() time.Time) *Outage {
	if now == nil {
		now = time.Now
	}
	return &Outage{what: what, remind: DefaultRemind, now: now}
}

// Failed records a failed attempt. The first of a run of failures is
// logged at error level; later ones only every DefaultRemind.
func (o *Outage) Failed(logger klog.Logger, err error, keysAndValues ...any) {
	o.mu.Lock()
	now := o.now()
	o.failures++
	first := o.since.IsZero()
	if first {
		o.since = now
	}
	remind := !first && now.Sub(o.logged) >= o.remind
	if first || remind {
		o.logged = now
	}
	since, failures := o.since, o.failures
	o.mu.Unlock()
	logger = logger.WithCallDepth(1) // the line of the caller, not this one
	switch {
	case first:
		logger.Error(err, "Failed to "+o.what+"; retrying, and logging again when it recovers", keysAndValues...)
	case remind:
		logger.Error(err, "Still failing to "+o.what, append(keysAndValues, "failingFor", now.Sub(since).Round(time.Second).String(), "failures", failures)...)
	}
}

// Recovered records a success: if a failure was going on, its end is
// logged at level 0.
func (o *Outage) Recovered(logger klog.Logger, keysAndValues ...any) {
	o.mu.Lock()
	if o.since.IsZero() {
		o.mu.Unlock()
		return
	}
	failingFor, failures := o.now().Sub(o.since), o.failures
	o.since, o.failures = time.Time{}, 0
	o.mu.Unlock()
	logger.WithCallDepth(1).Info("Recovered: "+o.what+" succeeded again", append(keysAndValues, "failingFor", failingFor.Round(time.Millisecond).String(), "failures", failures)...)
}
