package server

import (
	"errors"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/pkg/wire"
)

// kickPumpLocked starts t's pump unless one runs or the queue's end was
// delivered: the receive loop calls it after queueing DATA, and whoever
// closes the queue after closing it. A pump runs only while there is
// something to deliver, so that an idle tunnel holds no goroutine (see
// ondemand.Loop). Called with Server.mu held: a closing Server starts
// none, and drops what an idle tunnel queued, as a running pump does
// when it sees the Server close.
func (r *relay) kickPumpLocked(t *tunnel) {
	if r.life.closed {
		if t.pump.End() {
			r.metrics.addQueuedBytes(-t.q.Close())
			r.life.pumps.Add(-1)
		}
		return
	}
	t.pump.Kick(func() {
		r.life.wg.Add(1)
		go r.pump(t)
	})
}

// kickPump is kickPumpLocked for a caller without Server.mu, which it
// takes only to start a pump: while one runs, as it does while DATA
// flows, a kick costs one uncontended lock, the pump's.
func (r *relay) kickPump(t *tunnel) {
	if t.pump.Running() {
		return
	}
	r.mu.Lock()
	r.kickPumpLocked(t)
	r.mu.Unlock()
}

// pump delivers a flow-controlled tunnel's queued DATA to its frontend,
// granting the agent credit as it goes, until the queue is empty. Once
// the queue is closed, or the Server closes while it runs, it delivers
// the CLOSE_RSP that closed it, if any, and forgets the tunnel at the
// frontend.
func (r *relay) pump(t *tunnel) {
	defer r.life.wg.Done()
	for {
		var b []byte
		if !t.pump.Next(func() bool {
			var more bool
			b, more = t.q.TryNext(wire.MaxDataPayload)
			return b != nil || !more
		}) {
			return // idle: the next kick starts another
		}
		quitting := isClosed(r.life.quit)
		if b == nil || quitting {
			t.pump.End()
			if quitting {
				// What a closing Server leaves queued goes with it.
				r.metrics.addQueuedBytes(-t.q.Close() - len(b))
			}
			break
		}
		r.metrics.addQueuedBytes(-len(b))
		t.fe.deliver(wire.Data(t.connectID, b), nil)
		if grant := t.q.Release(len(b)); grant > 0 {
			t.be.peer.send(wire.WindowUpdate(t.connectID, grant), 0, r.life.quit, nil)
		}
	}
	defer r.life.tunnelMayHaveEnded()
	defer r.life.pumps.Add(-1)
	r.mu.Lock()
	last := t.last
	r.mu.Unlock()
	if last != nil {
		t.fe.deliver(last, nil)
	}
	// Only now, after its last packet: a frontend packet for the tunnel
	// answered "unknown connectID" before it would overtake the data.
	r.mu.Lock()
	t.fe.forget(t)
	r.mu.Unlock()
}

// isClosed reports whether c, a channel that is only ever closed, is.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// onWindowUpdate handles WINDOW from agent stream be: credit for a
// tunnel's frontend to send more.
func (r *relay) onWindowUpdate(be *agentStream, pkt *client.Packet) {
	id, n, ok := wire.ParseWindowUpdate(pkt)
	if !ok || be.peerWindow == 0 {
		r.log.V(4).Info("Ignored a WINDOW packet", "agentID", be.logID, "flowControl", be.peerWindow > 0)
		return
	}
	be.connMu.Lock()
	t := be.conns[id]
	be.connMu.Unlock()
	if t != nil && t.credit != nil {
		t.credit.Give(n)
	}
}

// onAgentData handles DATA from agent stream be.
func (r *relay) onAgentData(be *agentStream, pkt *client.Packet) {
	id := pkt.GetData().GetConnectID()
	be.connMu.Lock()
	t := be.conns[id]
	_, closing := be.closing[id]
	be.connMu.Unlock()
	if t == nil {
		if closing {
			return // its frontend is gone, and its CLOSE_REQ on its way
		}
		r.log.V(4).Info("Data matched no connection, closing it at the agent", "agentID", be.logID, "connectionID", id)
		be.peer.sendControl(wire.CloseReq(id), id)
		return
	}
	if t.q != nil {
		r.queueAgentData(be, t, pkt.GetData().GetData())
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
func (r *relay) queueAgentData(be *agentStream, t *tunnel, data []byte) {
	err := t.q.Put(data)
	switch {
	case err == nil:
		r.metrics.addQueuedBytes(len(data))
		r.kickPump(t)
		return
	case !errors.Is(err, flow.ErrWindowExceeded):
		return // the tunnel is ending: its data goes nowhere
	}
	r.log.V(2).Info("Closed a tunnel whose agent sent more than the flow-control window", "agentID", be.logID, "connectionID", t.connectID, "window", r.window)
	r.mu.Lock()
	established := be.conns[t.connectID] == t
	if established {
		r.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextWindowExceeded))
	}
	r.mu.Unlock()
	if established {
		be.peer.sendTunnelControl(wire.CloseReq(t.connectID), t.connectID)
	}
}

// sendCredited sends DATA of flow-controlled tunnel t, from a gRPC
// frontend that ends when feDone closes, to its agent without waiting for
// credit, so that one tunnel short of credit does not hold up the others
// of that frontend's stream (nor their CLOSE_REQ and DIAL_CLS). What the
// credit covers goes now; the rest waits in t's outbox, sent by
// sendOutbox as credit comes. The caller, the frontend's receive loop,
// waits only when the outbox is full too, a window's worth: that is
// back-pressure on a frontend sending faster than its endpoint reads, and
// it is bounded by FrontendWriteTimeout, after which the tunnel is ended.
func (r *relay) sendCredited(t *tunnel, data []byte, feDone <-chan struct{}) {
	ob := t.outbox // set by this goroutine alone
	for ob == nil && len(data) > 0 {
		n, _ := t.credit.TryTake(min(len(data), wire.MaxDataPayload))
		if n == 0 {
			break
		}
		p := data
		if n < len(data) {
			// Cut with its capacity, so that wire.Recycle does not take
			// a prefix for the whole buffer.
			p = data[:n:n]
		}
		if !r.sendToAgent(t.be, wire.Data(t.connectID, p), feDone) {
			return
		}
		data = data[n:]
	}
	if len(data) == 0 {
		return
	}
	if ob == nil {
		if ob = r.openOutbox(t, feDone); ob == nil {
			return // the tunnel is over: its data goes nowhere
		}
	}
	var timer *time.Timer
	for len(data) > 0 {
		n := min(len(data), wire.MaxDataPayload)
		err := ob.Put(data[:n:n])
		if err == nil {
			data = data[n:]
			continue
		}
		if !errors.Is(err, flow.ErrWindowExceeded) {
			return // the tunnel is over
		}
		if timer == nil {
			timer = time.NewTimer(r.writeTimeout)
			defer timer.Stop()
		}
		select {
		case <-ob.Room():
		case <-feDone:
			return
		case <-timer.C:
			r.endStuckTunnel(t, tunnelEndedNoCredit)
			return
		}
	}
}

// openOutbox gives established tunnel t its outbox and starts sendOutbox
// on it; nil when t is over or the Server closes.
func (r *relay) openOutbox(t *tunnel, feDone <-chan struct{}) *flow.Queue {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.be.conns[t.connectID] != t || r.life.closed {
		return nil
	}
	ob := flow.NewBoundedQueue(max(t.be.peerWindow, wire.MaxDataPayload))
	t.outbox = ob
	r.life.wg.Add(1)
	go r.sendOutbox(t, ob, feDone)
	return ob
}

// onFrontendCloseRequest handles a gRPC frontend's CLOSE_REQ for
// established tunnel t: it goes to the agent after the frontend's data
// that waits for credit in t's outbox, if any.
func (r *relay) onFrontendCloseRequest(t *tunnel) {
	r.mu.Lock()
	ob := t.outbox
	if ob != nil {
		t.closeAfterOutbox = true
	}
	r.mu.Unlock()
	if ob != nil {
		ob.CloseWrite()
		return
	}
	r.sendCloseReq(t)
}

// sendOutbox sends what waits in t's outbox to t's agent as credit comes,
// then CLOSE_REQ if the frontend asked for it. It ends with the tunnel or
// the frontend (feDone). A wait for credit is bounded by
// FrontendWriteTimeout: an agent that grants none for so long loses the
// tunnel, which frees the frontend's receive loop if it waits for room in
// the outbox.
func (r *relay) sendOutbox(t *tunnel, ob *flow.Queue, feDone <-chan struct{}) {
	defer r.life.wg.Done()
	for {
		b, ok := ob.Next(wire.MaxDataPayload, feDone)
		if !ok {
			break
		}
		for len(b) > 0 {
			n := r.takeCreditWithin(t, len(b), feDone)
			if n == 0 {
				ob.Release(len(b))
				return
			}
			// A fresh slice: the outbox's bytes are its own, and the
			// packet's writer recycles only whole buffers of wire's.
			if !r.sendToAgent(t.be, wire.Data(t.connectID, b[:n:n]), feDone) {
				ob.Release(len(b))
				return
			}
			ob.Release(n)
			b = b[n:]
		}
	}
	r.mu.Lock()
	send := t.closeAfterOutbox && t.be.conns[t.connectID] == t
	r.mu.Unlock()
	if send {
		r.sendToAgent(t.be, wire.CloseReq(t.connectID), feDone)
	}
}

// takeCreditWithin waits up to FrontendWriteTimeout for credit for t and
// takes up to max bytes of it. It returns 0 when the tunnel or the
// frontend ended first, or when the time passed: then it ends t.
func (r *relay) takeCreditWithin(t *tunnel, max int, feDone <-chan struct{}) int {
	if n, open := t.credit.TryTake(max); n > 0 || !open {
		return n
	}
	timer := time.NewTimer(r.writeTimeout)
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
			r.endStuckTunnel(t, tunnelEndedNoCredit)
			return 0
		}
	}
}

// endStuckTunnel ends established tunnel t, stuck for reason, at both
// ends: the frontend gets CLOSE_RSP with an error after the data on its
// way, and the agent CLOSE_REQ.
func (r *relay) endStuckTunnel(t *tunnel, reason tunnelEndedReason) {
	r.mu.Lock()
	established := t.be.conns[t.connectID] == t
	direct := false
	if established {
		direct = r.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextNoCredit))
	}
	r.mu.Unlock()
	if !established {
		return
	}
	r.metrics.observeTunnelEnded(reason)
	r.logs.info(r.log, "no-credit", "Ended a tunnel whose agent granted no flow-control credit for too long", "agentID", t.be.logID, "connectionID", t.connectID, "timeout", r.writeTimeout)
	if direct {
		t.fe.deliver(wire.CloseRsp(t.connectID, errTextNoCredit), nil)
	}
	t.be.peer.sendTunnelControl(wire.CloseReq(t.connectID), t.connectID)
}

// sendData sends DATA pkt of tunnel t, from a frontend that ends when
// feDone closes, to t's agent in packets of at most MaxDataPayload. With
// flow control each piece first waits for the agent's credit; then, as
// every packet, for room on the stream (sendToAgent). It reports whether
// all of it was queued.
func (r *relay) sendData(t *tunnel, pkt *client.Packet, feDone <-chan struct{}) bool {
	data := pkt.GetData().GetData()
	if t.credit == nil && len(data) <= wire.MaxDataPayload {
		return r.sendToAgent(t.be, pkt, feDone) // forwarded as it came
	}
	// konnectivity-client sends each Write as one DATA packet of up to
	// MaxMessageSize: queued whole, 32 of them would hold 512 MiB on the
	// agent stream.
	ok := true
	wire.SplitData(data, func(piece []byte) bool {
		ok = r.sendPiece(t, piece, feDone)
		return ok
	})
	return ok
}

// sendPiece sends piece, at most MaxDataPayload bytes of t's data, to t's
// agent: with flow control in as many packets as the credit it gets
// allows. It reports false when the tunnel, the frontend or the stream
// ended first.
func (r *relay) sendPiece(t *tunnel, piece []byte, feDone <-chan struct{}) bool {
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
		if !r.sendToAgent(t.be, wire.Data(t.connectID, p), feDone) {
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
func (r *relay) sendToAgent(be *agentStream, pkt *client.Packet, feDone <-chan struct{}) bool {
	if be.peer.offer(pkt) {
		return true
	}
	r.metrics.addWaitingForAgent(1)
	defer r.metrics.addWaitingForAgent(-1)
	select {
	case be.peer.room <- struct{}{}:
		be.peer.push(pkt)
		return true
	case <-be.peer.done:
	case <-feDone:
	case <-r.life.quit:
	}
	return false
}
