package server

import (
	"math/rand/v2"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/pkg/wire"
)

// startDial chooses an agent for a dial to address over protocol and
// records a pending dial for fe. A zero random means "choose one" (for
// HTTP CONNECT). The caller then queues the DIAL_REQ on the returned
// stream, which is t.be as startDial returns (t.be may change later, if
// the dial is retried).
func (s *Server) startDial(fe frontend, protocol, address string, random int64) (*tunnel, *agentStream, error) {
	key := dialHostKey(address)
	for {
		// Chosen without Server.mu, which every packet takes; a stream
		// that ended or stopped answering since is chosen again.
		be, tier, st := s.routes.choose(s.cfg.Strategies, key, nil)
		s.mu.Lock()
		if be != nil && (be.gone || tier < tierUnresponsive && !be.unresponsive.IsZero()) {
			// It ended, or was taken for unresponsive, meanwhile.
			s.mu.Unlock()
			continue
		}
		t, err := s.startDialLocked(fe, be, st, protocol, address, random)
		s.mu.Unlock()
		if err != nil {
			return nil, nil, err
		}
		return t, be, nil
	}
}

// startDialLocked records a pending dial on be, found by strategy st (nil
// when none found one). Called with Server.mu held.
func (s *Server) startDialLocked(fe frontend, be *agentStream, st Strategy, protocol, address string, random int64) (*tunnel, error) {
	if s.closed || s.shuttingDown {
		return nil, errShuttingDown
	}
	if random == 0 {
		for random == 0 || s.pending[random] != nil {
			random = rand.Int64()
		}
	} else if s.pending[random] != nil {
		s.metrics.observeDuplicateDial()
		return nil, errDuplicateDial
	}
	if be == nil {
		s.metrics.observeDialFailure(dialFailureNoAgent)
		return nil, errNoAgent
	}
	t := &tunnel{fe: fe, be: be, random: random, protocol: protocol, address: address, strategy: st, dialed: time.Now()}
	s.pending[random] = t
	be.pending[random] = t
	fe.track(t)
	s.armDialTimerLocked(t)
	s.metrics.addPendingDials(1)
	return t, nil
}

// armDialTimerLocked starts the BackendDialTimeout of t's attempt, the
// last one's stopped. Called with Server.mu held.
func (s *Server) armDialTimerLocked(t *tunnel) {
	t.attempt++
	if t.timer != nil {
		t.timer.Stop()
	}
	if d := s.cfg.BackendDialTimeout; d > 0 {
		attempt := t.attempt
		t.timer = time.AfterFunc(d, func() { s.dialTimedOut(t, attempt) })
	}
}

// retryLocked sends pending dial t, if it was not sent again already, to
// another agent that t's strategy accepts and that answers dials, and
// tells its agent (DIAL_CLS) that it need not answer. It reports whether
// it did; send then queues the packets, once Server.mu is unlocked.
// Called with Server.mu held.
func (s *Server) retryLocked(t *tunnel, reason retryReason) (send func(), ok bool) {
	if t.attempt > 1 || s.pending[t.random] != t {
		return nil, false
	}
	old := t.be
	nb, tier, _ := s.routes.choose([]Strategy{t.strategy}, dialHostKey(t.address), old)
	if nb == nil || tier == tierUnresponsive {
		return nil, false
	}
	delete(old.pending, t.random)
	nb.pending[t.random] = t
	t.be, t.dialed = nb, time.Now()
	s.armDialTimerLocked(t)
	s.metrics.observeDialRetry(reason)
	s.log.V(2).Info("Sent a dial to another agent", "reason", reason, "agentID", old.logID, "newAgentID", nb.logID, "dialID", t.random)
	req := wire.DialReq(t.protocol, t.address, t.random)
	return func() {
		// Without waiting: a sweep or a timer sends them, never a
		// frontend's loop; an agent that leaves too many unread loses
		// its stream.
		nb.peer.sendTunnelControl(req, t.random)
		old.peer.sendTunnelControl(wire.DialCls(t.random), t.random)
	}, true
}

// dropPendingLocked forgets a pending dial everywhere, counting it as a
// failure for reason. It reports whether t was pending.
func (s *Server) dropPendingLocked(t *tunnel, reason dialFailureReason) bool {
	if s.pending[t.random] != t {
		return false
	}
	delete(s.pending, t.random)
	delete(t.be.pending, t.random)
	if t.timer != nil {
		t.timer.Stop()
	}
	t.fe.forget(t)
	s.metrics.addPendingDials(-1)
	s.tunnelMayHaveEnded()
	if reason != "" {
		s.metrics.observeDialFailure(reason)
	}
	return true
}

// dialTimedOut handles a dial whose agent did not answer within
// Config.BackendDialTimeout (of attempt): it is sent to another agent if
// it can be (retryLocked), else answered with an error. A late DIAL_RSP
// then finds no pending dial, and a connection it opened is closed. An
// agent that leaves backendDialTimeouts dials in a row unanswered is
// taken for unresponsive.
func (s *Server) dialTimedOut(t *tunnel, attempt int) {
	s.mu.Lock()
	if s.closed || s.pending[t.random] != t || t.attempt != attempt {
		s.mu.Unlock()
		return
	}
	be := t.be
	be.timeouts++
	var sends []func()
	if be.timeouts >= backendDialTimeouts {
		sends = s.markUnresponsiveLocked(be, time.Now(), "dials in a row timed out")
	}
	if send, ok := s.retryLocked(t, retryTimeout); ok {
		sends = append(sends, send)
		s.mu.Unlock()
		for _, send := range sends {
			send()
		}
		return
	}
	s.dropPendingLocked(t, dialFailureBackendDialTimeout)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	for _, send := range sends {
		send()
	}
	s.log.V(2).Info("Backend dial timed out", "agentID", be.logID, "dialID", t.random, "timeout", s.cfg.BackendDialTimeout)
	t.fe.answer(wire.DialRsp(t.random, 0, errTextDialTimeout))
}

// cancelDial drops fe's pending dial random (DIAL_CLS, or the frontend
// gave up).
func (s *Server) cancelDial(fe frontend, random int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.pending[random]; t != nil && t.fe == fe {
		s.dropPendingLocked(t, dialFailureFrontendClose)
	}
}

// onDialResponse handles DIAL_RSP from agent stream be.
func (s *Server) onDialResponse(be *agentStream, pkt *client.Packet) {
	rsp := pkt.GetDialResponse()
	s.mu.Lock()
	t := be.pending[rsp.GetRandom()]
	if t == nil {
		// A late answer is an answer: the agent is responsive.
		s.answeredLocked(be)
		s.mu.Unlock()
		s.metrics.observeDialFailure(dialFailureUnrecognizedResponse)
		s.log.V(2).Info("Dial response matched no pending dial", "agentID", be.logID, "dialID", rsp.GetRandom(), "connectionID", rsp.GetConnectID())
		if id := rsp.GetConnectID(); id != 0 {
			be.peer.sendControl(wire.CloseReq(id), id)
		}
		return
	}
	s.answeredLocked(be)
	failed := rsp.GetError() != "" || rsp.GetConnectID() == 0
	reason := dialFailureReason("")
	if failed {
		reason = dialFailureErrorResponse
	}
	s.dropPendingLocked(t, reason)
	if failed {
		s.mu.Unlock()
		t.fe.answer(pkt)
		return
	}
	t.connectID = rsp.GetConnectID()
	if _, dup := be.conns[t.connectID]; dup || !t.fe.established(t) {
		s.metrics.observeDuplicateDial()
		s.mu.Unlock()
		// About the dial this stream held: one per dial.
		be.peer.sendTunnelControl(wire.CloseReq(t.connectID), t.connectID)
		t.fe.answer(wire.DialRsp(t.random, 0, errTextDuplicateID))
		return
	}
	be.conns[t.connectID] = t
	t.established = time.Now()
	s.metrics.addEstablished(1)
	s.metrics.observeDialDuration(t.established.Sub(t.dialed))
	if be.peerWindow > 0 && !s.closed {
		t.q = flow.NewQueue(s.cfg.TunnelWindow)
		t.credit = flow.NewWindow(be.peerWindow)
		s.pumps.Add(1) // until a pump has delivered the queue's end
	}
	s.mu.Unlock()
	t.fe.answer(pkt)
}
