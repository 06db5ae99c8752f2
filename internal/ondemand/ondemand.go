// Package ondemand runs a goroutine only while there is work for it: a
// tunnel's or a stream's writer that costs nothing while the tunnel is
// idle, which for tens of thousands of idle tunnels is most of a proxy's
// memory.
//
// The hard part is the stop. A goroutine that finds no work and stops
// races with a producer that adds work and sees the goroutine still
// running: unless the two are ordered, the work waits for a wake-up that
// never comes. A Loop orders them with one lock: the goroutine looks for
// work under it (Next), and marks itself stopped under it when it finds
// none; a producer adds its work first and then calls Kick, which takes
// the same lock. Either Next saw the work, or the Kick came after the
// stop and starts another goroutine.
package ondemand

import "sync"

// Loop is the state of one goroutine that runs only while there is work:
// stopped, running, or ended for good. The zero value is a stopped Loop.
type Loop struct {
	mu sync.Mutex
	// running: a goroutine runs. ended: none starts any more. Guarded by
	// mu.
	running, ended bool
}

// Kick starts a goroutine by calling start, unless one runs or the Loop
// has ended, and reports whether it did. Whoever gives the goroutine work
// (queues something, closes its queue) calls Kick after. start runs
// under the Loop's lock, before the Loop counts as running: it starts
// the goroutine (whose first Next waits for Kick to return) and records
// what must be true once Running reports true. It must not call the
// Loop's methods.
func (l *Loop) Kick(start func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running || l.ended {
		return false
	}
	start()
	l.running = true
	return true
}

// Next is how the running goroutine takes its work: it calls take under
// the Loop's lock and reports what take reports, whether there was work.
// When there was none, the goroutine counts as stopped, and is to return:
// the next Kick starts another. take must not call the Loop's methods.
//
// take decides alone what counts as work: a closed queue whose end the
// goroutine must still act on is work. Where the work is more than one
// thing that can change while take looks (data and a close flag), take
// must look at the one that is set last first (the close): data added
// before the close is then seen with it.
func (l *Loop) Next(take func() bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if take() {
		return true
	}
	l.running = false
	return false
}

// End ends the Loop: no goroutine starts after it. It reports whether
// this call ended it while no goroutine ran, in which case the caller
// does whatever that goroutine would have done last (drops a queue,
// releases a count); called by the running goroutine itself, or a second
// time, it reports false.
//
// A goroutine that runs when another calls End is not told: it goes on
// until its Next finds no work, and then stops like any idle one, its
// last work undone. A caller that may End a running Loop therefore
// first gives it work that ends it (closes its queue), as it would to
// stop it without End.
func (l *Loop) End() (stopped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.ended = true
	return !l.running
}

// Running reports whether a goroutine runs: one that returned without
// Next's stop (because its stream ended) counts as running for good.
//
// A producer that finds one running need not Kick: the goroutine's next
// look for work comes after this call, under the same lock, and sees
// what the producer added before it. That is why Running takes the lock:
// read without it, the answer could be of a goroutine that has already
// looked and is about to stop. A producer that must take another lock to
// start a goroutine (and may not hold it while it calls Kick) can so
// take it only when none runs.
func (l *Loop) Running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running
}
