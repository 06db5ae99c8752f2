package fleet

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/servercount/servercount/internal/proxytest"
)

// Wait reads every agent every PollInterval until cond holds for each, or
// ctx ends. It returns, per agent, the first read at which cond held (a
// zero time for an agent it never held for), and on ctx's end an error
// saying how many agents were still waited for.
func (f *Fleet) Wait(ctx context.Context, cond func(*Agent) bool) ([]time.Time, error) {
	reached := make([]time.Time, len(f.agents))
	left := len(f.agents)
	ticker := time.NewTicker(f.cfg.PollInterval)
	defer ticker.Stop()
	for {
		now := time.Now()
		for i, a := range f.agents {
			if reached[i].IsZero() && cond(a) {
				reached[i] = now
				left--
			}
		}
		if left == 0 {
			return reached, nil
		}
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return reached, fmt.Errorf("%d of %d agents still waited for: %w", left, len(f.agents), ctx.Err())
		}
	}
}

// Holding is a condition for [Fleet.Wait]: the agent holds n servers.
func Holding(n int) func(*Agent) bool {
	return func(a *Agent) bool { return a.Held() == n }
}

// Latest returns the latest of ts minus start: how long the last agent
// took. A zero time counts as not reached and makes ok false.
func Latest(start time.Time, ts []time.Time) (d time.Duration, ok bool) {
	ok = true
	for _, t := range ts {
		if t.IsZero() {
			ok = false
			continue
		}
		d = max(d, t.Sub(start))
	}
	return d, ok
}

// Watch reads every agent every PollInterval in the background and
// remembers the fewest servers each held; see [Fleet.Watch].
type Watch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex // guards fewest
	fewest []int
}

// Watch starts watching how many servers each agent holds, until
// [Watch.Stop] or the end of the test.
func (f *Fleet) Watch() *Watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watch{cancel: cancel, done: make(chan struct{}), fewest: make([]int, len(f.agents))}
	for i, a := range f.agents {
		w.fewest[i] = a.Held()
	}
	go func() {
		defer close(w.done)
		ticker := time.NewTicker(f.cfg.PollInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
			case <-ctx.Done():
				return
			}
			w.mu.Lock()
			for i, a := range f.agents {
				w.fewest[i] = min(w.fewest[i], a.Held())
			}
			w.mu.Unlock()
		}
	}()
	f.tb.Cleanup(func() { w.Stop() })
	return w
}

// Stop ends the watch and returns the fewest servers any agent held while
// it ran. It may be called more than once.
func (w *Watch) Stop() (fewest int) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.fewest) == 0 {
		return 0
	}
	return slices.Min(w.fewest)
}

// queryLog keeps when each DNS query arrived.
type queryLog struct {
	mu    sync.Mutex // guards times
	times []time.Time
}

func newQueryLog() *queryLog { return &queryLog{} }

func (l *queryLog) add(string) {
	now := time.Now()
	l.mu.Lock()
	l.times = append(l.times, now)
	l.mu.Unlock()
}

// between returns the times in [from, to), oldest first.
func (l *queryLog) between(from, to time.Time) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Handlers run concurrently, so times is nearly but not quite sorted.
	sort.Slice(l.times, func(i, j int) bool { return l.times[i].Before(l.times[j]) })
	lo := sort.Search(len(l.times), func(i int) bool { return !l.times[i].Before(from) })
	hi := sort.Search(len(l.times), func(i int) bool { return !l.times[i].Before(to) })
	return append([]time.Time(nil), l.times[lo:hi]...)
}

// MaxInWindow returns the most of ts (sorted) that fall in any window of
// length w.
func MaxInWindow(ts []time.Time, w time.Duration) int {
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// WaitServers reads servers every PollInterval until each holds n agent
// streams, or ctx ends, and returns when they all did. With every agent
// holding as many servers as there are in servers, this is the proof that
// each agent holds these servers and not others.
func (f *Fleet) WaitServers(ctx context.Context, servers []*proxytest.Server, n int) (time.Time, error) {
	ticker := time.NewTicker(f.cfg.PollInterval)
	defer ticker.Stop()
	for {
		now := time.Now()
		all := true
		for _, s := range servers {
			if s.Core().Backends() != n {
				all = false
				break
			}
		}
		if all {
			return now, nil
		}
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return now, fmt.Errorf("servers never all held %d agent streams: %w", n, ctx.Err())
		}
	}
}
