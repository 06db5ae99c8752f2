package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
)

// called records the end of a list or watch call: a failure marks the API
// server down at once, before the informer's retries report it, so that
// no lease expires in the count while nobody can see it renewed.
func (c *Counter) called(ctx context.Context, verb string, start time.Time, err error) {
	if c.cfg.Observe != nil {
		code, reason := statusOf(err)
		c.cfg.Observe(Call{Verb: verb, Code: code, Reason: reason, Duration: time.Since(start)})
	}
	if err != nil {
		c.failed(ctx, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiErr != nil {
		klog.FromContext(ctx).Info("Watching proxy-server leases again", "selector", c.cfg.LabelSelector, "down", c.cfg.Clock.Now().Sub(c.apiDown).Round(time.Millisecond))
		c.recovered(c.cfg.Clock.Now())
		c.signal()
	}
}

// recovered ends an outage of the API server. Renewals made while it was
// down could not be seen, which is not the same as not made: a lease
// still valid when the outage began counts for one more duration from
// now, by which time its holder has renewed it, or has gone. c.mu must be
// held.
func (c *Counter) recovered(now time.Time) {
	for _, e := range c.leases {
		if end, ok := e.renewal.expiry(); ok && end.After(c.apiDown) {
			e.renewal.seen = now
			c.place(e, now)
		}
	}
	c.apiErr, c.apiDown = nil, time.Time{}
	c.recount(now)
}

// observeErrors passes w's events on, and marks the API server down when
// w ends with an error event. The informer lists again only after its
// back-off, which after an outage can be a minute: a restarted API server
// answers a watch from before the outage with 410 Expired, and until the
// new list the informer sees no renewal, so the leases it holds would
// expire one by one in the count.
func (c *Counter) observeErrors(ctx context.Context, w watch.Interface, cancel context.CancelFunc) watch.Interface {
	o := &observedWatch{Interface: w, events: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer cancel()
		defer close(o.events)
		for ev := range w.ResultChan() {
			select {
			case <-o.stop:
				return // errors now are those of reading a stopped stream
			default:
			}
			if ev.Type == watch.Error {
				c.failed(ctx, fmt.Errorf("watch ended: %w", apierrors.FromObject(ev.Object)))
			}
			select {
			case o.events <- ev:
			case <-o.stop:
				return // the source closes its channel on Stop
			}
		}
	}()
	return o
}

// observedWatch is a watch whose events pass through observeErrors.
type observedWatch struct {
	watch.Interface
	events   chan watch.Event
	stop     chan struct{}
	stopOnce sync.Once
}

func (o *observedWatch) ResultChan() <-chan watch.Event { return o.events }

func (o *observedWatch) Stop() {
	o.stopOnce.Do(func() { close(o.stop) })
	o.Interface.Stop()
}

// failed records a list or watch failure that the informer will retry.
func (c *Counter) failed(ctx context.Context, err error) {
	if errors.Is(err, context.Canceled) {
		return // Close
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiErr == nil {
		klog.FromContext(ctx).Info("Cannot watch proxy-server leases; keeping the last count until the API server answers", "selector", c.cfg.LabelSelector, "err", err)
		c.apiDown = c.cfg.Clock.Now()
		c.signal()
	}
	c.apiErr = err
}
