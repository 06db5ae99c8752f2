package server

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/wire"
)

// liveness is the part of a Server that proves its agent streams alive:
// the liveness sweep, one goroutine per Server, whatever the number of
// agents, checks the agent streams. An idle fleet of thousands of agents
// then costs one wake-up per period, not one per stream; and each round
// touches only the streams its checks may act on, since at 5,000 agents
// visiting every stream twice a second cost more than all their
// heartbeats together, and visiting each once a second still cost about
// a microsecond a stream (a cache miss or more for each of its
// structures), heartbeats or not.
//
// What it checks, and what it does:
//   - a stream on which nothing moved while packets waited
//     (StreamStallTimeout) is ended: the backstop of the package doc;
//   - a stream whose receive loop has been inside one packet for
//     StreamStallTimeout is ended: the loop waits on something it should
//     never wait on, and only ending the stream frees it;
//   - on a stream with heartbeats on, a HEARTBEAT goes out when nothing
//     was sent for the server's interval, and the stream is ended when
//     nothing arrived for wire.SilenceLimit of the agent's interval while
//     the receive loop waited: a stopped process, a black hole or a
//     frozen relay, found in seconds rather than by TCP in minutes;
//   - an agent that leaves a dial unanswered for UnansweredDialTimeout
//     with nothing received since but plain HEARTBEATs (a deaf agent
//     still sends them) is taken for unresponsive: its dials go
//     to other agents (pendingDials.retry), it gets new ones only when nobody
//     else can take them (routes.choose), and after StreamStallTimeout so,
//     its stream is ended, within the bounds of mayEndLocked.
//
// The first three are checked each streamPeriod, on the streams that are
// due: each check gives the earliest time at which it could next act
// (checkStream), and liveness.swept keeps those times in one array, so that
// a round reads a few bytes a stream and visits only the streams due. The
// last needs a shorter period: it runs each answerPeriod, on the streams
// with a pending dial (or on all while one is unresponsive).
//
// Its state is guarded by Server.mu (mu), not a lock of its own: taking
// an agent for unresponsive sends its pending dials elsewhere, and a
// dial's answer takes it back, in one step with the dials' state.
type liveness struct {
	// All set by New. cfg is a copy of the Server's: the sweep reads its
	// timeouts, heartbeat and strategies.
	mu      *sync.Mutex // Server.mu
	cfg     Config
	mono    clock.Monotonic
	metrics *metrics
	log     klog.Logger
	logs    *logLimiter
	routes  *routes
	dials   *pendingDials
	// swept holds every agent stream with when it is next due for its
	// checks. Guarded by mu.
	swept sweepList
	// nUnresponsive counts the agent streams taken for unresponsive.
	// Guarded by mu.
	nUnresponsive int
	// sweeping is set when the sweep has started. Guarded by mu.
	sweeping bool
}

// addLocked starts checking be, and starts the sweep with wg at the
// first stream, to run until quit closes. Called with mu held.
func (l *liveness) addLocked(be *agentStream, wg *sync.WaitGroup, quit <-chan struct{}) {
	l.swept.add(be)
	if !l.sweeping {
		l.sweeping = true
		wg.Go(func() { l.sweepLoop(quit) })
	}
}

// removeLocked stops checking be, which is gone. Called with mu held.
func (l *liveness) removeLocked(be *agentStream) {
	l.swept.remove(be)
	if !be.unresponsive.IsZero() {
		l.nUnresponsive--
		l.metrics.addUnresponsive(-1)
	}
}

// all returns the agent streams checked, in no order, for the caller to
// read while it holds mu. Called with mu held.
func (l *liveness) all() []*agentStream { return l.swept.streams }

// sweepLoop runs the sweep until quit closes.
func (l *liveness) sweepLoop(quit <-chan struct{}) {
	answerPeriod, streamPeriod := l.cfg.sweepPeriods()
	ticker := time.NewTicker(answerPeriod)
	defer ticker.Stop()
	var sw sweeper
	for {
		select {
		case <-quit:
			return
		case now := <-ticker.C:
			// A round is due once streamPeriod less half a tick has
			// passed since the last: now is the tick's scheduled time,
			// and the half tick is a margin against rounding.
			all := now.Sub(sw.lastAll) >= streamPeriod-answerPeriod/2
			if all {
				sw.lastAll = now
			}
			l.sweep(now, &sw, all)
		}
	}
}

// sweepList is every registered agent stream, in no order, with when its
// checks are next due (on the sweep's monotonic clock, see sweeper; 0 for
// the next round). The times are an array of their own, apart from the
// streams, so that finding the streams due reads no stream.
type sweepList struct {
	streams []*agentStream
	due     []int64
}

// add appends be, due at the next round.
func (l *sweepList) add(be *agentStream) {
	be.sweepIndex = len(l.streams)
	l.streams = append(l.streams, be)
	l.due = append(l.due, 0)
}

// remove takes be out, moving the last stream into its place.
func (l *sweepList) remove(be *agentStream) {
	i, last := be.sweepIndex, len(l.streams)-1
	l.streams[i], l.due[i] = l.streams[last], l.due[last]
	l.streams[i].sweepIndex = i
	l.streams[last] = nil
	l.streams, l.due = l.streams[:last], l.due[:last]
}

// appendDue appends to streams those due at now, and returns it.
func (l *sweepList) appendDue(streams []*agentStream, now int64) []*agentStream {
	for i, t := range l.due {
		if t <= now {
			streams = append(streams, l.streams[i])
		}
	}
	return streams
}

// setDue sets when be is next due, unless it has been removed.
func (l *sweepList) setDue(be *agentStream, t int64) {
	if !be.gone {
		l.due[be.sweepIndex] = t
	}
}

// sweeper is what the sweep keeps from one round to the next: arrays to
// reuse, when it last checked the streams due, and how many it checked
// then.
//
// Due times, as the streams' own times, are readings of Server.mono:
// nanoseconds of the monotonic clock. A wall clock set back by an hour
// (NTP, a VM restored) would otherwise leave every stream unvisited for
// that hour, and one set forward end every stream for silence.
type sweeper struct {
	streams []*agentStream
	due     []*agentStream
	next    []int64
	seen    map[*agentStream]struct{}
	lastAll time.Time
	checked int
}

// sweep does one round at now: the answer checks of the streams that may
// need them, and, when all is set, the checks of the streams due.
func (l *liveness) sweep(now time.Time, sw *sweeper, all bool) {
	l.mu.Lock()
	streams := sw.streams[:0]
	switch {
	case l.nUnresponsive > 0:
		streams = append(streams, l.swept.streams...)
	case l.dials.len() > 0:
		if sw.seen == nil {
			sw.seen = map[*agentStream]struct{}{}
		}
		streams = l.dials.appendStreams(streams, sw.seen)
	}
	var actions []func()
	for _, be := range streams {
		actions = append(actions, l.checkAnswersLocked(be, now)...)
	}
	mono := l.mono.Of(now)
	due := sw.due[:0]
	if all {
		due = l.swept.appendDue(due, mono)
	}
	l.mu.Unlock()
	for _, act := range actions {
		act()
	}
	if all {
		next := sw.next[:0]
		for _, be := range due {
			t := int64(math.MaxInt64)
			if wait := l.checkStream(be, mono); wait != never {
				t = mono + int64(wait)
			}
			next = append(next, t)
		}
		l.mu.Lock()
		for i, be := range due {
			l.swept.setDue(be, next[i])
		}
		l.mu.Unlock()
		sw.next = next
		sw.checked = len(due)
	}
	// No stream kept alive until the next round.
	clear(streams)
	clear(due)
	sw.streams, sw.due = streams, due
}

// never is the wait of a stream that no check will act on.
const never = time.Duration(math.MaxInt64)

// checkStream does the checks of one agent stream that need no lock:
// the stall backstop, a stuck receive loop, heartbeats and silence, at
// now, a reading of Server.mono. It returns how long after now one of
// them could act next: none can act sooner, whatever happens on the
// stream meanwhile, since what moves on a stream moves these times later
// (but for a moment's preemption between reading the clock and storing a
// time).
func (l *liveness) checkStream(be *agentStream, now int64) (wait time.Duration) {
	p := be.peer
	if p.ended.Load() {
		return never
	}
	wait = never
	// after is how long after now d will have passed since t, a time
	// that a check reads from the stream, or, when t is 0 (not set yet),
	// since now.
	after := func(t int64, d time.Duration) time.Duration {
		return time.Duration(cmp.Or(t, now)-now) + d
	}
	if d := l.cfg.StreamStallTimeout; d > 0 {
		if p.stalled(now, d) {
			l.endStream(be, streamEndedStalled, errStalled, "Ended an agent stream on which nothing moved while packets waited; the agent will connect again", "stallTimeout", d)
			return never
		}
		if p.busy(now) >= d {
			l.endStream(be, streamEndedReceiveStuck, errReceiveStuck, "Ended an agent stream whose receive loop was stuck inside one packet; the agent will connect again", "stallTimeout", d)
			return never
		}
		// A writer that starts later sets moved when it starts (startWriter).
		moved := int64(0)
		if p.writer.Running() {
			moved = p.moved.Load()
		}
		wait = min(after(moved, d), after(p.handling.Load(), d))
	}
	if be.peerHeartbeat == 0 {
		return wait
	}
	silence := wire.Silence(be.peerHeartbeat)
	if p.idle(now) >= silence {
		l.endStream(be, streamEndedSilent, errSilent, "Ended the stream of an agent that sent nothing, not even a heartbeat, for too long: its process is stopped or the path to it is broken", "silence", silence, "agentHeartbeat", be.peerHeartbeat)
		return never
	}
	wait = min(wait, after(p.waiting.Load(), silence))
	sent := p.sent.Load()
	if since(now, sent) >= l.cfg.Heartbeat {
		p.sendControl(wire.Heartbeat(), 0)
		sent = now // the writer sets sent once it has sent it
	}
	return min(wait, after(sent, l.cfg.Heartbeat))
}

// endStream ends be for reason (err, the stream's status), logged at
// level 0 with msg and kv (the lines of each reason bounded: a broken
// network can end thousands at once) and counted.
func (l *liveness) endStream(be *agentStream, reason streamEndedReason, err error, msg string, kv ...any) {
	l.metrics.observeStreamEnded(reason)
	l.logs.info(l.log, "ended/"+string(reason), msg, append([]any{"agentID", be.logID}, kv...)...)
	be.peer.end(err)
}

// checkAnswersLocked takes be for unresponsive when a dial of its has
// waited UnansweredDialTimeout with nothing received from it since (but
// plain HEARTBEATs: see peer.received), and
// ends the stream of one that has been unresponsive for
// StreamStallTimeout. It returns what to do once Server.mu is unlocked.
// Called with Server.mu held.
func (l *liveness) checkAnswersLocked(be *agentStream, now time.Time) []func() {
	if !be.unresponsive.IsZero() {
		if d := l.cfg.StreamStallTimeout; d > 0 && now.Sub(be.unresponsive) >= d && l.mayEndLocked(be) {
			return []func(){func() {
				l.endStream(be, streamEndedUnresponsive, errUnresponsive, "Ended the stream of an agent that answered no dial for too long; its pending dials fail, and it may connect again", "unresponsiveFor", now.Sub(be.unresponsive).Round(time.Second).String())
			}}
		}
		return nil
	}
	d := l.cfg.UnansweredDialTimeout
	if d <= 0 || len(be.pending) == 0 {
		return nil
	}
	var oldest time.Time
	for _, t := range be.pending {
		if oldest.IsZero() || t.dialed.Before(oldest) {
			oldest = t.dialed
		}
	}
	if now.Sub(oldest) < d || be.peer.received.Load() >= l.mono.Of(oldest) {
		return nil
	}
	return l.markUnresponsiveLocked(be, now, "a dial waited with nothing received from the agent since")
}

// markUnresponsiveLocked takes be for unresponsive, unless it is already
// or half the agent streams are: then it changes nothing, so that the
// agents left to pick are never fewer than half. Its pending dials are
// sent to other agents. It returns what to do once Server.mu is unlocked:
// the retries' packets and the log. Called with Server.mu held.
func (l *liveness) markUnresponsiveLocked(be *agentStream, now time.Time, why string) []func() {
	if !be.unresponsive.IsZero() {
		return nil
	}
	if 2*(l.nUnresponsive+1) > len(l.all()) {
		l.log.V(2).Info("Agent answers no dials, but half the agent streams are taken for unresponsive already: it keeps its share", "agentID", be.logID, "why", why)
		return nil
	}
	be.unresponsive = now
	l.routes.setUnresponsive(be, true)
	l.nUnresponsive++
	l.metrics.addUnresponsive(1)
	var actions []func()
	for _, t := range be.pending { // retry deletes t from be.pending: safe in a range
		if send, ok := l.dials.retry(t, retryUnresponsive); ok {
			actions = append(actions, send)
		}
	}
	retried := len(actions)
	return append(actions, func() {
		be.answering.Failed(l.log, errors.New(why), "agentID", be.logID, "retriedDials", retried)
	})
}

// answeredLocked records that be answered a dial: it is responsive. Called
// with Server.mu held.
func (l *liveness) answeredLocked(be *agentStream) {
	be.timeouts = 0
	if be.unresponsive.IsZero() {
		return
	}
	be.unresponsive = time.Time{}
	l.routes.setUnresponsive(be, false)
	l.nUnresponsive--
	l.metrics.addUnresponsive(-1)
	be.answering.Recovered(l.log, "agentID", be.logID)
}

// mayEndLocked reports whether the stream of unresponsive agent be may be
// ended. Not when destHost is among the strategies and no stream of
// another agent that answers dials claims one of be's hosts: that host's
// dials have nowhere else to go, and an agent that may yet answer is
// better than none. Called with Server.mu held.
func (l *liveness) mayEndLocked(be *agentStream) bool {
	return !slices.Contains(l.cfg.Strategies, StrategyDestHost) || l.routes.servedElsewhere(be)
}
