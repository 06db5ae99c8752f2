package server

import (
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/wire"
)

// pendingDials is the part of a Server that holds the dials sent to
// agents and not yet answered: by random, for a frontend's DIAL_CLS and
// the sweep, and on each agent stream (agentStream.pending), for its
// DIAL_RSPs; each with the timer of its attempt, and sent to another
// agent once at most. What a dial's end means to the frontend, the agent
// and Shutdown is the Server's (dial.go).
//
// Its state is guarded by Server.mu, not a lock of its own: a dial's
// answer changes the dial, its agent stream's answer count and whether
// that agent is taken for unresponsive (the sweep's) together.
type pendingDials struct {
	byRandom map[int64]*tunnel
	routes   *routes
	metrics  *metrics
	log      klog.Logger
	// timeout is Config.BackendDialTimeout (0: none), and timedOut what
	// an attempt's timer calls when it passes.
	timeout  time.Duration
	timedOut func(t *tunnel, attempt int)
}

// unusedRandom returns a random no pending dial has, for a dial that
// came without one (HTTP CONNECT).
func (d *pendingDials) unusedRandom() int64 {
	for {
		if r := rand.Int64(); r != 0 && d.byRandom[r] == nil {
			return r
		}
	}
}

// has reports whether a dial with random is pending.
func (d *pendingDials) has(random int64) bool { return d.byRandom[random] != nil }

// get returns the pending dial with random, nil for none.
func (d *pendingDials) get(random int64) *tunnel { return d.byRandom[random] }

// len returns the number of pending dials.
func (d *pendingDials) len() int { return len(d.byRandom) }

// add records t, sent to t.be, and starts its timer.
func (d *pendingDials) add(t *tunnel) {
	d.byRandom[t.random] = t
	t.be.pending[t.random] = t
	d.arm(t)
	d.metrics.addPendingDials(1)
}

// arm starts the timer of t's next attempt, the last one's stopped.
func (d *pendingDials) arm(t *tunnel) {
	t.attempt++
	if t.timer != nil {
		t.timer.Stop()
	}
	if d.timeout > 0 {
		attempt := t.attempt
		t.timer = time.AfterFunc(d.timeout, func() { d.timedOut(t, attempt) })
	}
}

// retry sends pending dial t, if it was not sent again already, to
// another agent that t's strategy accepts and that answers dials, and
// tells its agent (DIAL_CLS) that it need not answer. It reports whether
// it did; send then queues the packets, once Server.mu is unlocked.
func (d *pendingDials) retry(t *tunnel, reason retryReason) (send func(), ok bool) {
	if t.attempt > 1 || d.byRandom[t.random] != t {
		return nil, false
	}
	old := t.be
	nb, tier, _ := d.routes.choose([]Strategy{t.strategy}, dialHostKey(t.address), old)
	if nb == nil || tier == tierUnresponsive {
		return nil, false
	}
	delete(old.pending, t.random)
	nb.pending[t.random] = t
	t.be, t.dialed = nb, time.Now()
	d.arm(t)
	d.metrics.observeDialRetry(reason)
	d.log.V(2).Info("Sent a dial to another agent", "reason", reason, "agentID", old.logID, "newAgentID", nb.logID, "dialID", t.random)
	req := wire.DialReq(t.protocol, t.address, t.random)
	return func() {
		// Without waiting: a sweep or a timer sends them, never a
		// frontend's loop; an agent that leaves too many unread loses
		// its stream.
		nb.peer.sendTunnelControl(req, t.random)
		old.peer.sendTunnelControl(wire.DialCls(t.random), t.random)
	}, true
}

// remove forgets t, if it is pending, and stops its timer. It reports
// whether t was pending.
func (d *pendingDials) remove(t *tunnel) bool {
	if d.byRandom[t.random] != t {
		return false
	}
	delete(d.byRandom, t.random)
	delete(t.be.pending, t.random)
	if t.timer != nil {
		t.timer.Stop()
	}
	d.metrics.addPendingDials(-1)
	return true
}

// stopTimers stops every pending dial's timer: the Server is closing.
func (d *pendingDials) stopTimers() {
	for _, t := range d.byRandom {
		if t.timer != nil {
			t.timer.Stop()
		}
	}
}

// appendStreams appends to streams, once each, the agent streams that
// have a pending dial, using seen (empty, and left empty) to tell.
func (d *pendingDials) appendStreams(streams []*agentStream, seen map[*agentStream]struct{}) []*agentStream {
	for _, t := range d.byRandom {
		if _, ok := seen[t.be]; !ok {
			seen[t.be] = struct{}{}
			streams = append(streams, t.be)
		}
	}
	clear(seen)
	return streams
}
