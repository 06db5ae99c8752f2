package server

import (
	"errors"
	"slices"
	"time"

	"github.com/servercount/servercount/pkg/wire"
)

// The liveness sweep: one goroutine per Server, whatever the number of
// agents, checks the agent streams. An idle fleet of thousands of agents
// then costs one wake-up per period, not one per stream; and each round
// touches only the streams its checks may act on, since at 5,000 agents
// visiting every stream twice a second cost more than all their
// heartbeats together.
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
//     with nothing received since is taken for unresponsive: its dials go
//     to other agents (retryLocked), it gets new ones only when nobody
//     else can take them (pickLocked), and after StreamStallTimeout so,
//     its stream is ended, within the bounds of mayEndLocked.
//
// The first three are checked on every stream each streamPeriod; the
// last, which needs a shorter period, each answerPeriod, and only on the
// streams with a pending dial (or on all while one is unresponsive).

// sweepLoop runs the sweep until the Server closes.
func (s *Server) sweepLoop() {
	answerPeriod, streamPeriod := s.cfg.sweepPeriods()
	ticker := time.NewTicker(answerPeriod)
	defer ticker.Stop()
	var sw sweeper
	for {
		select {
		case <-s.quit:
			return
		case now := <-ticker.C:
			// A round is due once streamPeriod less half a tick has
			// passed since the last: now is the tick's scheduled time,
			// and the half tick is a margin against rounding.
			all := now.Sub(sw.lastAll) >= streamPeriod-answerPeriod/2
			if all {
				sw.lastAll = now
			}
			s.sweep(now, &sw, all)
		}
	}
}

// sweeper is what the sweep keeps from one round to the next: arrays to
// reuse, and when it last checked every stream.
type sweeper struct {
	streams []*backend
	seen    map[*backend]struct{}
	lastAll time.Time
}

// sweep does one round at now: the answer checks of the streams that may
// need them, and, when all is set, the checks of every stream.
func (s *Server) sweep(now time.Time, sw *sweeper, all bool) {
	s.mu.Lock()
	streams := sw.streams[:0]
	switch {
	case all || s.nUnresponsive > 0:
		for _, a := range s.agents {
			streams = append(streams, a.streams...)
		}
	case len(s.pending) > 0:
		if sw.seen == nil {
			sw.seen = map[*backend]struct{}{}
		}
		for _, t := range s.pending {
			if _, ok := sw.seen[t.be]; !ok {
				sw.seen[t.be] = struct{}{}
				streams = append(streams, t.be)
			}
		}
		clear(sw.seen)
	}
	var actions []func()
	for _, be := range streams {
		actions = append(actions, s.checkAnswersLocked(be, now)...)
	}
	s.mu.Unlock()
	for _, act := range actions {
		act()
	}
	if all {
		for _, be := range streams {
			s.checkStream(be, now)
		}
	}
	clear(streams) // no stream kept alive until the next round
	sw.streams = streams
}

// checkStream does the checks of one agent stream that need no lock:
// the stall backstop, a stuck receive loop, heartbeats and silence.
func (s *Server) checkStream(be *backend, now time.Time) {
	p := be.peer
	if p.ended.Load() {
		return
	}
	if d := s.cfg.StreamStallTimeout; d > 0 {
		if p.stalled(now, d) {
			s.endStream(be, StreamEndedStalled, errStalled, "Ended an agent stream on which nothing moved while packets waited; the agent will connect again", "stallTimeout", d)
			return
		}
		if p.busy(now) >= d {
			s.endStream(be, StreamEndedReceiveStuck, errReceiveStuck, "Ended an agent stream whose receive loop was stuck inside one packet; the agent will connect again", "stallTimeout", d)
			return
		}
	}
	if be.peerHeartbeat == 0 {
		return
	}
	if silence := wire.Silence(be.peerHeartbeat); p.idle(now) >= silence {
		s.endStream(be, StreamEndedSilent, errSilent, "Ended the stream of an agent that sent nothing, not even a heartbeat, for too long: its process is stopped or the path to it is broken", "silence", silence, "agentHeartbeat", be.peerHeartbeat)
		return
	}
	if since(now, p.sent.Load()) >= s.cfg.Heartbeat {
		p.sendControl(wire.Heartbeat(), 0)
	}
}

// endStream ends be for reason (err, the stream's status), logged at
// level 0 with msg and kv and counted.
func (s *Server) endStream(be *backend, reason StreamEndedReason, err error, msg string, kv ...any) {
	s.metrics.observeStreamEnded(reason)
	s.log.Info(msg, append([]any{"agentID", be.logID}, kv...)...)
	be.peer.end(err)
}

// checkAnswersLocked takes be for unresponsive when a dial of its has
// waited UnansweredDialTimeout with nothing received from it since, and
// ends the stream of one that has been unresponsive for
// StreamStallTimeout. It returns what to do once Server.mu is unlocked.
// Called with Server.mu held.
func (s *Server) checkAnswersLocked(be *backend, now time.Time) []func() {
	if !be.unresponsive.IsZero() {
		if d := s.cfg.StreamStallTimeout; d > 0 && now.Sub(be.unresponsive) >= d && s.mayEndLocked(be) {
			return []func(){func() {
				s.endStream(be, StreamEndedUnresponsive, errUnresponsive, "Ended the stream of an agent that answered no dial for too long; its pending dials fail, and it may connect again", "unresponsiveFor", now.Sub(be.unresponsive).Round(time.Second).String())
			}}
		}
		return nil
	}
	d := s.cfg.UnansweredDialTimeout
	if d <= 0 || len(be.pending) == 0 {
		return nil
	}
	var oldest time.Time
	for _, t := range be.pending {
		if oldest.IsZero() || t.dialed.Before(oldest) {
			oldest = t.dialed
		}
	}
	if now.Sub(oldest) < d || !time.Unix(0, be.peer.received.Load()).Before(oldest) {
		return nil
	}
	return s.markUnresponsiveLocked(be, now, "a dial waited with nothing received from the agent since")
}

// markUnresponsiveLocked takes be for unresponsive, unless it is already
// or half the agent streams are: then it changes nothing, so that the
// agents left to pick are never fewer than half. Its pending dials are
// sent to other agents. It returns what to do once Server.mu is unlocked:
// the retries' packets and the log. Called with Server.mu held.
func (s *Server) markUnresponsiveLocked(be *backend, now time.Time, why string) []func() {
	if !be.unresponsive.IsZero() {
		return nil
	}
	if 2*(s.nUnresponsive+1) > s.nBackends {
		s.log.V(2).Info("Agent answers no dials, but half the agent streams are taken for unresponsive already: it keeps its share", "agentID", be.logID, "why", why)
		return nil
	}
	be.unresponsive = now
	s.routes.setUnresponsive(be, true)
	s.nUnresponsive++
	s.metrics.addUnresponsive(1)
	var actions []func()
	for _, t := range be.pending { // retryLocked deletes t from be.pending: safe in a range
		if send, ok := s.retryLocked(t, RetryUnresponsive); ok {
			actions = append(actions, send)
		}
	}
	retried := len(actions)
	return append(actions, func() {
		be.answering.Failed(s.log, errors.New(why), "agentID", be.logID, "retriedDials", retried)
	})
}

// answeredLocked records that be answered a dial: it is responsive. Called
// with Server.mu held.
func (s *Server) answeredLocked(be *backend) {
	be.timeouts = 0
	if be.unresponsive.IsZero() {
		return
	}
	be.unresponsive = time.Time{}
	s.routes.setUnresponsive(be, false)
	s.nUnresponsive--
	s.metrics.addUnresponsive(-1)
	be.answering.Recovered(s.log, "agentID", be.logID)
}

// mayEndLocked reports whether the stream of unresponsive agent be may be
// ended. Not when destHost is among the strategies and no stream of
// another agent that answers dials claims one of be's hosts: that host's
// dials have nowhere else to go, and an agent that may yet answer is
// better than none. Called with Server.mu held.
func (s *Server) mayEndLocked(be *backend) bool {
	return !slices.Contains(s.cfg.Strategies, StrategyDestHost) || s.routes.servedElsewhere(be)
}
