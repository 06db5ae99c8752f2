package servercounter

import (
	"context"
	"errors"
	"sync"
)

// MaxCounter counts the largest of several counts, such as a DNS count and
// a lease count while a fleet moves from one to the other: a server that
// either source sees is counted.
//
// A source that fails is left out; Count fails only when every source
// fails. MaxCounter is a [Notifier]: Changed fires when any source that is
// a Notifier signals a change. It is safe for concurrent use; Close stops
// its watch of the sources (it does not close them).
type MaxCounter struct {
	counters []Counter
	stop     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex // guards changed
	changed chan struct{}
}

var _ Notifier = (*MaxCounter)(nil)

// NewMaxCounter returns the largest of counters' counts.
func NewMaxCounter(counters ...Counter) *MaxCounter {
	m := &MaxCounter{counters: counters, stop: make(chan struct{}), changed: make(chan struct{})}
	for _, c := range counters {
		n, ok := c.(Notifier)
		if !ok {
			continue
		}
		// Subscribed here, and again before each relay, never after: a
		// change between a relay and the next subscription would be lost.
		changed := n.Changed()
		m.wg.Go(func() {
			for {
				select {
				case <-changed:
					changed = n.Changed()
					m.signal()
				case <-m.stop:
					return
				}
			}
		})
	}
	return m
}

// Count returns the result with the largest count among the sources that
// answered, and an error only when none did.
func (m *MaxCounter) Count(ctx context.Context) (Result, error) {
	var (
		best Result
		ok   bool
		errs []error
	)
	for _, c := range m.counters {
		res, err := c.Count(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok || res.Count > best.Count {
			best, ok = res, true
		}
	}
	if !ok {
		return Result{}, errors.Join(errs...)
	}
	return best, nil
}

// Changed returns a channel closed when any source signals a change.
func (m *MaxCounter) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *MaxCounter) signal() {
	m.mu.Lock()
	defer m.mu.Unlock()
	close(m.changed)
	m.changed = make(chan struct{})
}

// Refresh asks each source that is a [Refresher] to count again.
func (m *MaxCounter) Refresh() {
	for _, c := range m.counters {
		if r, ok := c.(Refresher); ok {
			r.Refresh()
		}
	}
}

var _ Refresher = (*MaxCounter)(nil)

// Close stops watching the sources for changes.
func (m *MaxCounter) Close() error {
	close(m.stop)
	m.wg.Wait()
	return nil
}
