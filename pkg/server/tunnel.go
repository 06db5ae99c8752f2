package server

import (
	"errors"
	"io"
	"math/rand/v2"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/pkg/wire"
)

// Dial error texts sent to frontends. "No agent available" and the
// timeout text are upstream's, which clients may match.
const (
	errTextNoAgent        = "No agent available"
	errTextDialTimeout    = "timed out waiting for backend dial"
	errTextBackendClosed  = "agent stream closed before the dial completed"
	errTextAgentGone      = "agent stream closed"
	errTextDuplicateID    = "connectID already in use on this frontend stream"
	errTextUnknownConnect = "unknown connectID"
	errTextWindowExceeded = "agent sent more than its flow-control window"
	errTextNoCredit       = "agent granted no flow-control credit in time"
)

var (
	//lint:ignore ST1005 upstream's exact DIAL_RSP text, which clients may match
	errNoAgent       = errors.New(errTextNoAgent)
	errDuplicateDial = errors.New("a dial with the same random is pending")
)

// frontend is the side that asked for a tunnel: a ProxyService stream or
// an HTTP CONNECT connection.
type frontend interface {
	// deliver hands pkt (DIAL_RSP, DATA or CLOSE_RSP) to the frontend. It
	// waits at most Config.FrontendWriteTimeout for room and tears the
	// frontend down if it stays full; it gives up, dropping pkt, when
	// abort closes (nil: never), so that an agent stream's receive loop
	// that waits here ends with its stream. It is never called with
	// Server.mu held.
	deliver(pkt *client.Packet, abort <-chan struct{})
	// answer hands pkt, a DIAL_RSP or CLOSE_RSP, to the frontend without
	// waiting, after what deliver handed it before: that is how an agent
	// stream's receive loop answers a frontend, so that it never waits on
	// one. A frontend that leaves too many answers unread is ended. It is
	// never called with Server.mu held.
	answer(pkt *client.Packet)
	// track records t as a pending dial of the frontend. Called with
	// Server.mu held.
	track(t *tunnel)
	// established records that t's dial succeeded with t.connectID; false
	// means the frontend cannot take it (the connectID collides). Called
	// with Server.mu held.
	established(t *tunnel) bool
	// forget drops t. Called with Server.mu held.
	forget(t *tunnel)
}

// tunnel is one dial, then one connection, between a frontend and an agent
// stream.
type tunnel struct {
	fe frontend
	// be is the agent stream of the dial, then of the connection. It
	// changes only while the dial is pending, when the dial is sent to
	// another agent (retry). Guarded by Server.mu while the dial is
	// pending; fixed after.
	be     *backend
	random int64
	// protocol and address are the dial's, and strategy the one that
	// chose be: what a retry sends, and to whom. Fixed.
	protocol, address string
	strategy          Strategy
	// attempt counts the agents the dial was sent to: a dial is retried
	// once at most (attempt 2), and the timer of an earlier attempt does
	// nothing. Guarded by Server.mu.
	attempt int
	// connectID is the agent's ID for the connection, 0 while the dial is
	// pending. Guarded by Server.mu.
	connectID int64
	// timer fires Config.BackendDialTimeout after the dial was sent; nil
	// without a timeout. Guarded by Server.mu.
	timer *time.Timer
	// dialed is when the dial was sent to its agent (the last one, after
	// a retry), and established when its DIAL_RSP made the tunnel, for
	// the duration histograms and the unresponsive check. Both guarded by
	// Server.mu.
	dialed, established time.Time

	// With flow control (see internal/flow), set before the tunnel is
	// established: q holds the agent's DATA for pump to deliver, and
	// credit is what the agent has room for. Both nil without.
	q      *flow.Queue
	credit *flow.Window
	// last is the packet pump delivers after the queued DATA: CLOSE_RSP.
	// Guarded by Server.mu.
	last *client.Packet
	// outbox holds a gRPC frontend's DATA that found no credit, for
	// sendOutbox to send as credit comes; nil until the first such DATA.
	// closeAfterOutbox is set when the frontend sent CLOSE_REQ after it.
	// Both guarded by Server.mu.
	outbox           *flow.Queue
	closeAfterOutbox bool
	// ending is set when a flow-controlled tunnel is over at the agent
	// while pump still delivers what it queued: the frontend keeps the
	// tunnel (its connectID stays taken, and what it sends for it is
	// dropped) until pump is done. Guarded by Server.mu.
	ending bool
}

// closeFromAgentLocked forgets established tunnel t, which the agent
// ended, and sees that pkt (its CLOSE_RSP) reaches the frontend after the
// data sent before it: with flow control pump delivers it after the
// queue; without, direct is true and the caller delivers it once it has
// unlocked Server.mu. Called with Server.mu held.
func (s *Server) closeFromAgentLocked(t *tunnel, pkt *client.Packet) (direct bool) {
	s.forgetConnLocked(t)
	if t.q == nil {
		return true
	}
	t.last = pkt
	t.q.CloseWrite()
	return false
}

// startDial chooses an agent for a dial to address over protocol and
// records a pending dial for fe. A zero random means "choose one" (for
// HTTP CONNECT). The caller then queues the DIAL_REQ on the returned
// stream, which is t.be as startDial returns (t.be may change later, if
// the dial is retried).
func (s *Server) startDial(fe frontend, protocol, address string, random int64) (*tunnel, *backend, error) {
	key := dialHostKey(address)
	for {
		// Chosen without Server.mu, which every packet takes; a stream
		// that ended since is chosen again, without it.
		be, _, st := s.routes.choose(s.cfg.Strategies, key, nil)
		s.mu.Lock()
		if be != nil && be.gone {
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
func (s *Server) startDialLocked(fe frontend, be *backend, st Strategy, protocol, address string, random int64) (*tunnel, error) {
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
		s.metrics.observeDialFailure(DialFailureNoAgent)
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
func (s *Server) retryLocked(t *tunnel, reason RetryReason) (send func(), ok bool) {
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
		nb.peer.sendControl(req, t.random)
		old.peer.sendControl(wire.DialCls(t.random), t.random)
	}, true
}

// dropPendingLocked forgets a pending dial everywhere, counting it as a
// failure for reason. It reports whether t was pending.
func (s *Server) dropPendingLocked(t *tunnel, reason DialFailureReason) bool {
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
	if send, ok := s.retryLocked(t, RetryTimeout); ok {
		sends = append(sends, send)
		s.mu.Unlock()
		for _, send := range sends {
			send()
		}
		return
	}
	s.dropPendingLocked(t, DialFailureBackendDialTimeout)
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
		s.dropPendingLocked(t, DialFailureFrontendClose)
	}
}

// onDialResponse handles DIAL_RSP from agent stream be.
func (s *Server) onDialResponse(be *backend, pkt *client.Packet) {
	rsp := pkt.GetDialResponse()
	s.mu.Lock()
	t := be.pending[rsp.GetRandom()]
	if t == nil {
		// A late answer is an answer: the agent is responsive.
		s.answeredLocked(be)
		s.mu.Unlock()
		s.metrics.observeDialFailure(DialFailureUnrecognizedResponse)
		s.log.V(2).Info("Dial response matched no pending dial", "agentID", be.logID, "dialID", rsp.GetRandom(), "connectionID", rsp.GetConnectID())
		if id := rsp.GetConnectID(); id != 0 {
			be.peer.sendControl(wire.CloseReq(id), id)
		}
		return
	}
	s.answeredLocked(be)
	failed := rsp.GetError() != "" || rsp.GetConnectID() == 0
	reason := DialFailureReason("")
	if failed {
		reason = DialFailureErrorResponse
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
		be.peer.sendControl(wire.CloseReq(t.connectID), t.connectID)
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
		s.wg.Add(1)
		s.pumps.Add(1)
		go s.pump(t)
	}
	s.mu.Unlock()
	t.fe.answer(pkt)
}

// pump delivers a flow-controlled tunnel's DATA from its queue to its
// frontend, granting the agent credit as the frontend takes it, and then
// the tunnel's last packet. A frontend that does not read makes pump wait
// (up to FrontendWriteTimeout, after which the frontend is ended), never
// the agent stream's receive loop.
func (s *Server) pump(t *tunnel) {
	defer s.wg.Done()
	defer s.tunnelMayHaveEnded()
	defer s.pumps.Add(-1)
	for {
		b, ok := t.q.Next(wire.MaxDataPayload, s.quit)
		if !ok {
			// What a closing Server leaves queued goes with it.
			s.metrics.addQueuedBytes(-t.q.Close())
			break
		}
		s.metrics.addQueuedBytes(-len(b))
		t.fe.deliver(wire.Data(t.connectID, b), nil)
		if grant := t.q.Release(len(b)); grant > 0 {
			t.be.peer.send(wire.WindowUpdate(t.connectID, grant), 0, s.quit, nil)
		}
	}
	s.mu.Lock()
	last := t.last
	s.mu.Unlock()
	if last != nil {
		t.fe.deliver(last, nil)
	}
	// Only now, after its last packet: a frontend packet for the tunnel
	// answered "unknown connectID" before it would overtake the data.
	s.mu.Lock()
	t.fe.forget(t)
	s.mu.Unlock()
}

// onWindowUpdate handles WINDOW from agent stream be: credit for a
// tunnel's frontend to send more.
func (s *Server) onWindowUpdate(be *backend, pkt *client.Packet) {
	id, n, ok := wire.ParseWindowUpdate(pkt)
	if !ok || be.peerWindow == 0 {
		s.log.V(4).Info("Ignored a WINDOW packet", "agentID", be.logID, "flowControl", be.peerWindow > 0)
		return
	}
	s.mu.Lock()
	t := be.conns[id]
	s.mu.Unlock()
	if t != nil && t.credit != nil {
		t.credit.Give(n)
	}
}

// onAgentData handles DATA from agent stream be.
func (s *Server) onAgentData(be *backend, pkt *client.Packet) {
	id := pkt.GetData().GetConnectID()
	s.mu.Lock()
	t := be.conns[id]
	s.mu.Unlock()
	if t == nil {
		s.log.V(4).Info("Data matched no connection, closing it at the agent", "agentID", be.logID, "connectionID", id)
		be.peer.sendControl(wire.CloseReq(id), id)
		return
	}
	if t.q != nil {
		s.queueAgentData(be, t, pkt.GetData().GetData())
		return
	}
	if len(pkt.GetData().GetData()) <= wire.MaxDataPayload {
		t.fe.deliver(pkt, be.peer.done) // forwarded as it came: no new packet to build
		return
	}
	// Queued in pieces, each waiting for room like any packet, so that the
	// frontend's queue holds at most queueSize x MaxDataPayload bytes
	// whatever size the agent sends.
	wire.SplitData(pkt.GetData().GetData(), func(piece []byte) bool {
		t.fe.deliver(wire.Data(id, piece), be.peer.done)
		return true
	})
}

// queueAgentData queues DATA of a flow-controlled tunnel for pump: it
// never waits. An agent that sends more than the window loses the tunnel.
func (s *Server) queueAgentData(be *backend, t *tunnel, data []byte) {
	err := t.q.Put(data)
	switch {
	case err == nil:
		s.metrics.addQueuedBytes(len(data))
		return
	case !errors.Is(err, flow.ErrWindowExceeded):
		return // the tunnel is ending: its data goes nowhere
	}
	s.log.V(2).Info("Closed a tunnel whose agent sent more than the flow-control window", "agentID", be.logID, "connectionID", t.connectID, "window", s.cfg.TunnelWindow)
	s.mu.Lock()
	established := be.conns[t.connectID] == t
	if established {
		s.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextWindowExceeded))
	}
	s.mu.Unlock()
	if established {
		be.peer.sendControl(wire.CloseReq(t.connectID), t.connectID)
	}
}

// sendOutbox sends what waits in t's outbox to t's agent as credit comes,
// then CLOSE_REQ if the frontend asked for it. It ends with the tunnel or
// the frontend (feDone). A wait for credit is bounded by
// FrontendWriteTimeout: an agent that grants none for so long loses the
// tunnel, which frees the frontend's receive loop if it waits for room in
// the outbox.
func (s *Server) sendOutbox(t *tunnel, ob *flow.Queue, feDone <-chan struct{}) {
	defer s.wg.Done()
	for {
		b, ok := ob.Next(wire.MaxDataPayload, feDone)
		if !ok {
			break
		}
		for len(b) > 0 {
			n := s.takeCreditWithin(t, len(b), feDone)
			if n == 0 {
				ob.Release(len(b))
				return
			}
			// A fresh slice: the outbox's bytes are its own, and the
			// packet's writer recycles only whole buffers of wire's.
			if !s.sendToAgent(t.be, wire.Data(t.connectID, b[:n:n]), feDone) {
				ob.Release(len(b))
				return
			}
			ob.Release(n)
			b = b[n:]
		}
	}
	s.mu.Lock()
	send := t.closeAfterOutbox && t.be.conns[t.connectID] == t
	s.mu.Unlock()
	if send {
		s.sendToAgent(t.be, wire.CloseReq(t.connectID), feDone)
	}
}

// takeCreditWithin waits up to FrontendWriteTimeout for credit for t and
// takes up to max bytes of it. It returns 0 when the tunnel or the
// frontend ended first, or when the time passed: then it ends t.
func (s *Server) takeCreditWithin(t *tunnel, max int, feDone <-chan struct{}) int {
	if n, open := t.credit.TryTake(max); n > 0 || !open {
		return n
	}
	timer := time.NewTimer(s.cfg.FrontendWriteTimeout)
	defer timer.Stop()
	for {
		n, open := t.credit.TryTake(max)
		if n > 0 || !open {
			return n
		}
		select {
		case <-t.credit.Ready():
		case <-feDone:
			return 0
		case <-timer.C:
			s.endStuckTunnel(t, TunnelEndedNoCredit)
			return 0
		}
	}
}

// endStuckTunnel ends established tunnel t, stuck for reason, at both
// ends: the frontend gets CLOSE_RSP with an error after the data on its
// way, and the agent CLOSE_REQ.
func (s *Server) endStuckTunnel(t *tunnel, reason TunnelEndedReason) {
	s.mu.Lock()
	established := t.be.conns[t.connectID] == t
	direct := false
	if established {
		direct = s.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextNoCredit))
	}
	s.mu.Unlock()
	if !established {
		return
	}
	s.metrics.observeTunnelEnded(reason)
	s.log.Info("Ended a tunnel whose agent granted no flow-control credit for too long", "agentID", t.be.logID, "connectionID", t.connectID, "timeout", s.cfg.FrontendWriteTimeout)
	if direct {
		t.fe.deliver(wire.CloseRsp(t.connectID, errTextNoCredit), nil)
	}
	t.be.peer.sendControl(wire.CloseReq(t.connectID), t.connectID)
}

// onAgentCloseResponse handles CLOSE_RSP from agent stream be.
func (s *Server) onAgentCloseResponse(be *backend, pkt *client.Packet) {
	id := pkt.GetCloseResponse().GetConnectID()
	s.mu.Lock()
	t := be.conns[id]
	direct := t != nil && s.closeFromAgentLocked(t, pkt)
	s.mu.Unlock()
	if direct {
		t.fe.answer(pkt)
	}
}

// forgetConnLocked forgets an established connection everywhere.
func (s *Server) forgetConnLocked(t *tunnel) {
	if t.be.conns[t.connectID] != t {
		return
	}
	delete(t.be.conns, t.connectID)
	if t.q == nil {
		t.fe.forget(t)
	} else {
		t.ending = true // pump forgets it at the frontend when done
	}
	if t.credit != nil {
		t.credit.Close() // a frontend waiting for credit gives up
	}
	if t.outbox != nil {
		t.outbox.Close() // nobody is left to take what waits for credit
	}
	s.metrics.addEstablished(-1)
	s.metrics.observeConnection(time.Since(t.established))
	s.tunnelMayHaveEnded()
}

// closeFromFrontend ends t because its frontend went away: the dial is
// dropped if pending, else the agent gets CLOSE_REQ. Later packets for it
// find nothing (an agent's DATA is then answered with CLOSE_REQ again).
func (s *Server) closeFromFrontend(t *tunnel) {
	s.mu.Lock()
	if s.dropPendingLocked(t, DialFailureFrontendClose) {
		s.mu.Unlock()
		return
	}
	established := t.be.conns[t.connectID] == t
	if established {
		s.forgetConnLocked(t)
	}
	q := t.q
	s.mu.Unlock()
	if q != nil {
		// Nobody is left to read what the agent sent.
		s.metrics.addQueuedBytes(-q.Close())
	}
	if established {
		t.be.peer.sendControl(wire.CloseReq(t.connectID), t.connectID)
	}
}

// ending reports whether t is over at the agent while its data is still
// being delivered.
func (s *Server) ending(t *tunnel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.ending
}

// sendData sends DATA pkt of tunnel t, from a frontend that ends when
// feDone closes, to t's agent in packets of at most MaxDataPayload. With
// flow control each piece first waits for the agent's credit; then, as
// every packet, for room on the stream (sendToAgent). It reports whether
// all of it was queued.
func (s *Server) sendData(t *tunnel, pkt *client.Packet, feDone <-chan struct{}) bool {
	data := pkt.GetData().GetData()
	if t.credit == nil && len(data) <= wire.MaxDataPayload {
		return s.sendToAgent(t.be, pkt, feDone) // forwarded as it came
	}
	// konnectivity-client sends each Write as one DATA packet of up to
	// MaxMessageSize: queued whole, 32 of them would hold 512 MiB on the
	// agent stream.
	ok := true
	wire.SplitData(data, func(piece []byte) bool {
		ok = s.sendPiece(t, piece, feDone)
		return ok
	})
	return ok
}

// sendPiece sends piece, at most MaxDataPayload bytes of t's data, to t's
// agent: with flow control in as many packets as the credit it gets
// allows. It reports false when the tunnel, the frontend or the stream
// ended first.
func (s *Server) sendPiece(t *tunnel, piece []byte, feDone <-chan struct{}) bool {
	for len(piece) > 0 {
		n := len(piece)
		if t.credit != nil {
			if n = t.credit.Take(n, feDone); n == 0 {
				return false
			}
		}
		// A prefix is cut with its capacity, so that wire.Recycle does not
		// take it for the whole buffer while its rest waits for credit.
		p := piece
		if n < len(piece) {
			p = piece[:n:n]
		}
		if !s.sendToAgent(t.be, wire.Data(t.connectID, p), feDone) {
			return false
		}
		piece = piece[n:]
	}
	return true
}

// sendToAgent queues pkt, from a frontend that ends when feDone closes,
// on agent stream be. While be's queue is full it waits (back-pressure on
// that frontend), counted as waiting for the agent, until there is room,
// be ends, the frontend ends or the Server closes: a frontend must never
// outlive its own end because its agent does not read. It reports whether
// pkt was queued.
func (s *Server) sendToAgent(be *backend, pkt *client.Packet, feDone <-chan struct{}) bool {
	select {
	case be.peer.out <- pkt:
		be.peer.queued.add(dataLen(pkt))
		return true
	default:
	}
	s.metrics.addWaitingForAgent(1)
	defer s.metrics.addWaitingForAgent(-1)
	select {
	case be.peer.out <- pkt:
		be.peer.queued.add(dataLen(pkt))
		return true
	case <-be.peer.done:
	case <-feDone:
	case <-s.quit:
	}
	return false
}

// backendGone unregisters agent stream be and tells every frontend with a
// dial or a connection through it.
func (s *Server) backendGone(be *backend) {
	s.mu.Lock()
	s.removeBackendLocked(be)
	var dials, conns []*tunnel
	for _, t := range be.pending {
		dials = append(dials, t)
	}
	for _, t := range dials {
		s.dropPendingLocked(t, DialFailureBackendClose)
	}
	for _, t := range be.conns {
		conns = append(conns, t)
	}
	var direct []*tunnel
	for _, t := range conns {
		if s.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextAgentGone)) {
			direct = append(direct, t)
		}
	}
	s.mu.Unlock()
	// The answers say why the stream ended, without waiting: this runs
	// on the stream's receive loop.
	why := ""
	if err := be.peer.reason; err != nil && !errors.Is(err, io.EOF) {
		why = ": " + capPeer(err.Error())
	}
	for _, t := range dials {
		t.fe.answer(wire.DialRsp(t.random, 0, errTextBackendClosed+why))
	}
	for _, t := range direct {
		t.fe.answer(wire.CloseRsp(t.connectID, errTextAgentGone+why))
	}
}
