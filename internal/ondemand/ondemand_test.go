package ondemand

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor bounds every wait in these tests: reached only by a failure.
const waitFor = 10 * time.Second

// worklist is the work of the tests' loops: items counted in and out by
// a goroutine that runs while there are some.
type worklist struct {
	loop    Loop
	mu      sync.Mutex
	pending int
	taken   atomic.Int64
	started atomic.Int64
	// working counts goroutines between a Next that found work and their
	// next Next: never more than 1. (After a Next that found none, a
	// goroutine is stopped: the next may start while it returns.)
	working atomic.Int32
	wg      sync.WaitGroup
	overlap atomic.Bool
}

// add queues one item and kicks the loop, as a producer does; with
// runningFirst only when no goroutine runs, as a producer does that must
// take another lock to start one.
func (w *worklist) add(runningFirst bool) {
	w.mu.Lock()
	w.pending++
	w.mu.Unlock()
	if runningFirst && w.loop.Running() {
		return
	}
	w.loop.Kick(w.start)
}

func (w *worklist) start() {
	w.started.Add(1)
	w.wg.Add(1)
	go w.run()
}

func (w *worklist) run() {
	defer w.wg.Done()
	for w.loop.Next(w.takeOne) {
		if w.working.Add(1) > 1 {
			w.overlap.Store(true)
		}
		w.taken.Add(1)
		w.working.Add(-1)
	}
}

func (w *worklist) takeOne() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == 0 {
		return false
	}
	w.pending--
	return true
}

// TestNoWorkIsLeftWithoutAGoroutine adds items one at a time, each as
// soon as the last was taken, while the goroutine that took it goes on to
// find no more and stop: tens of thousands of adds racing a stop. Every
// item must be taken, by one goroutine at a time. A stop that a Kick can
// miss (the stop marked outside Next's lock, or Kick looking at running
// without it) leaves an item with no goroutine, and the wait for it ends
// in failure; so does a Running that answers without the lock, for a
// producer that kicks only when it finds none running.
func TestNoWorkIsLeftWithoutAGoroutine(t *testing.T) {
	for _, runningFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "kick", true: "running-first"}[runningFirst], func(t *testing.T) {
			var w worklist
			const items = 30000
			for i := range int64(items) {
				w.add(runningFirst)
				deadline := time.Now().Add(waitFor)
				for w.taken.Load() <= i {
					if time.Now().After(deadline) {
						t.Fatalf("item %d was left without a goroutine (%d goroutine starts)", i, w.started.Load())
					}
					runtime.Gosched()
				}
			}
			w.wg.Wait()
			assert.False(t, w.overlap.Load(), "two goroutines ran at once")
			assert.False(t, w.loop.Running())
			// About nine items in ten find the goroutine stopped; on a
			// loaded machine fewer, but not one in a hundred.
			assert.Greater(t, w.started.Load(), int64(items/100), "the goroutine must have stopped and started again often, or the test tried nothing")
			t.Logf("%d items, %d goroutine starts", items, w.started.Load())
		})
	}
}

// TestKickDuringTheLastLook kicks while the goroutine, inside Next, looks
// for work and finds none: the Kick waits for the look to end, and then
// starts a goroutine, which takes the item added meanwhile.
func TestKickDuringTheLastLook(t *testing.T) {
	var w worklist
	w.add(false)
	require.Eventually(t, func() bool { return w.taken.Load() == 1 && !w.loop.Running() }, waitFor, time.Millisecond)
	w.wg.Wait()

	looking, kicked := make(chan struct{}), make(chan struct{})
	var started bool
	var once sync.Once
	w.loop.Kick(func() {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for w.loop.Next(func() bool {
				if w.takeOne() {
					return true
				}
				once.Do(func() { close(looking) })
				// The Kick comes while this look is on, after it found
				// nothing: it must wait for the look to end. (If it does
				// not, it returns meanwhile.)
				select {
				case <-kicked:
				case <-time.After(10 * time.Millisecond):
				}
				return false
			}) {
				w.taken.Add(1)
			}
		}()
	})
	<-looking
	w.mu.Lock()
	w.pending++
	w.mu.Unlock()
	go func() {
		started = w.loop.Kick(w.start)
		close(kicked)
	}()
	<-kicked
	assert.True(t, started, "a Kick during the goroutine's last look must start the next one")
	require.Eventually(t, func() bool { return w.taken.Load() == 2 }, waitFor, time.Millisecond)
	w.wg.Wait()
}

func TestEnd(t *testing.T) {
	t.Run("stopped", func(t *testing.T) {
		var l Loop
		assert.True(t, l.End(), "no goroutine ran: the caller does its last work")
		assert.False(t, l.End(), "ended already")
		assert.False(t, l.Kick(func() { t.Error("started after End") }))
	})
	t.Run("running", func(t *testing.T) {
		var l Loop
		stop := make(chan struct{})
		var done sync.WaitGroup
		require.True(t, l.Kick(func() {
			done.Go(func() {
				<-stop
				l.Next(func() bool { return false })
			})
		}))
		assert.True(t, l.Running())
		assert.False(t, l.End(), "a goroutine runs: it does its last work itself")
		close(stop)
		done.Wait()
		assert.False(t, l.Running())
		assert.False(t, l.Kick(func() { t.Error("started after End") }))
	})
}
