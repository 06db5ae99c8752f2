package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/internal/ondemand"
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
	be     *agentStream
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
	// pending. Set under Server.mu before the tunnel is published to its
	// frontend and agent stream; fixed after.
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
	// pump runs relay.pump while q holds something (see kickPump); it
	// ends once a pump has delivered the end of the queue.
	pump ondemand.Loop
	// last is the packet pump delivers after the queued DATA: CLOSE_RSP.
	// Guarded by Server.mu.
	last *client.Packet
	// outbox holds a gRPC frontend's DATA that found no credit, for
	// sendOutbox to send as credit comes; nil until the first such DATA.
	// It is set under Server.mu by the frontend's receive loop, the one
	// reader without it. closeAfterOutbox is set when the frontend sent
	// CLOSE_REQ after it. Both guarded by Server.mu.
	outbox           *flow.Queue
	closeAfterOutbox bool
	// ending is set when a flow-controlled tunnel is over at the agent
	// while pump still delivers what it queued: the frontend keeps the
	// tunnel (its connectID stays taken, and what it sends for it is
	// dropped) until pump is done. Set under Server.mu, read by the
	// frontends without it.
	ending atomic.Bool
}

// relay is the part of a Server that carries a tunnel's packets between
// its frontend and its agent stream once the dial is answered: DATA both
// ways, with flow control (credit.go) or without, and the tunnel's end
// from either side. Its state is the tunnels' and the agent streams'
// (conns, closing), changed under Server.mu (mu) as the dials are, since
// an answered dial becomes a tunnel under that lock. A tunnel's DATA and
// WINDOW find it under a lock that other agents' and frontends' tunnels
// do not contend on: an agent's under its stream's connMu, a gRPC
// frontend's under that frontend's connMu. Server.mu is taken per burst,
// not per packet: to start a flow-controlled tunnel's idle pump, to open
// its outbox, and at its end.
type relay struct {
	// All set by New. window is Config.TunnelWindow, the room for an
	// agent's data this server grants each flow-controlled tunnel, and
	// writeTimeout Config.FrontendWriteTimeout.
	mu           *sync.Mutex // Server.mu
	window       int
	writeTimeout time.Duration
	life         *lifecycle
	dials        *pendingDials
	metrics      *metrics
	log          klog.Logger
	logs         *logLimiter
}

// establishLocked makes answered dial t, which its agent named
// t.connectID, a tunnel of t.be. It reports false, and changes nothing,
// when t.be or t's frontend has a tunnel by that ID already. The flow
// control of t is set before t is published to the frontend and the
// agent stream, which read it without Server.mu. Called with Server.mu
// held.
func (r *relay) establishLocked(t *tunnel) bool {
	be := t.be
	if _, dup := be.conns[t.connectID]; dup {
		return false
	}
	flowControl := be.peerWindow > 0 && !r.life.closed
	if flowControl {
		t.q = flow.NewQueue(r.window)
		t.credit = flow.NewWindow(be.peerWindow)
	}
	t.established = time.Now()
	if !t.fe.established(t) {
		t.q, t.credit = nil, nil
		return false
	}
	be.connMu.Lock()
	be.conns[t.connectID] = t
	be.connMu.Unlock()
	r.metrics.addEstablished(1)
	r.metrics.observeDialDuration(t.established.Sub(t.dialed))
	if flowControl {
		r.life.pumps.Add(1) // until a pump has delivered the queue's end
	}
	return true
}

// closeFromAgentLocked forgets established tunnel t, which the agent
// ended, and sees that pkt (its CLOSE_RSP) reaches the frontend after the
// data sent before it: with flow control pump delivers it after the
// queue; without, direct is true and the caller delivers it once it has
// unlocked Server.mu. Called with Server.mu held.
func (r *relay) closeFromAgentLocked(t *tunnel, pkt *client.Packet) (direct bool) {
	r.forgetConnLocked(t)
	if t.q == nil {
		return true
	}
	t.last = pkt
	t.q.CloseWrite()
	r.kickPumpLocked(t)
	return false
}

// onAgentCloseResponse handles CLOSE_RSP from agent stream be.
func (r *relay) onAgentCloseResponse(be *agentStream, pkt *client.Packet) {
	id := pkt.GetCloseResponse().GetConnectID()
	r.mu.Lock()
	t := be.conns[id]
	direct := t != nil && r.closeFromAgentLocked(t, pkt)
	r.mu.Unlock()
	if direct {
		t.fe.answer(pkt)
	}
}

// forgetConnLocked forgets an established connection everywhere.
func (r *relay) forgetConnLocked(t *tunnel) {
	if t.be.conns[t.connectID] != t {
		return
	}
	t.be.connMu.Lock()
	delete(t.be.conns, t.connectID)
	t.be.connMu.Unlock()
	if t.q == nil {
		t.fe.forget(t)
	} else {
		t.ending.Store(true) // pump forgets it at the frontend when done
	}
	if t.credit != nil {
		t.credit.Close() // a frontend waiting for credit gives up
	}
	if t.outbox != nil {
		t.outbox.Close() // nobody is left to take what waits for credit
	}
	r.metrics.addEstablished(-1)
	r.metrics.observeConnection(time.Since(t.established))
	r.life.tunnelMayHaveEnded()
}

// closeFromFrontend ends t because its frontend went away: the dial is
// dropped if pending, else the agent gets CLOSE_REQ. Later packets for it
// find nothing (an agent's DATA is then answered with CLOSE_REQ again,
// once the one on its way has gone).
func (r *relay) closeFromFrontend(t *tunnel) {
	r.mu.Lock()
	if r.dials.drop(t, dialFailureFrontendClose) {
		r.mu.Unlock()
		return
	}
	var send func()
	if t.be.conns[t.connectID] == t {
		// Marked as closing before it is forgotten: an agent's DATA
		// handled in between would find neither, and answer with a
		// CLOSE_REQ that cuts PlainAgentCloseDelay short.
		send = r.closeReqLocked(t)
		r.forgetConnLocked(t)
	}
	q := t.q
	if q != nil {
		// Nobody is left to read what the agent sent; a pump ends the
		// tunnel at the frontend.
		r.metrics.addQueuedBytes(-q.Close())
		r.kickPumpLocked(t)
	}
	r.mu.Unlock()
	if send != nil {
		send()
	}
}

// PlainAgentCloseDelay is how long a CLOSE_REQ for a tunnel that its
// frontend closed waits before it goes to an agent without flow control
// (upstream's protocol). Upstream's agent, on CLOSE_REQ, closes its
// endpoint at once: the DATA it has taken from the stream but not yet
// written to the endpoint is lost, and neither end hears of it. Nothing
// in that protocol says when it has written them. A tenth of a second
// lets it write what it holds: in the integrity suite (make integrity),
// 0 of 1044 tunnels per frontend lost their last bytes through our
// server with it, against 58-99 through upstream's own server and 85-92
// before the delay. It holds the agent's endpoint connection that much longer, and
// a gRPC frontend's tunnel, which ends with the agent's CLOSE_RSP; an
// HTTP CONNECT client is gone already. An agent with flow control (ours)
// writes what it holds before it closes, and gets CLOSE_REQ at once.
const PlainAgentCloseDelay = 100 * time.Millisecond

// sendCloseReq sends CLOSE_REQ for t, established and closed by its
// frontend, to t's agent after the tunnel's data (see closeReqLocked).
func (r *relay) sendCloseReq(t *tunnel) {
	if t.be.peerWindow > 0 {
		t.be.peer.sendTunnelControl(wire.CloseReq(t.connectID), t.connectID)
		return
	}
	r.mu.Lock()
	send := r.closeReqLocked(t)
	r.mu.Unlock()
	if send != nil {
		send()
	}
}

// closeReqLocked returns what sends CLOSE_REQ for t, closed by its
// frontend, to t's agent once Server.mu is unlocked: at once to an agent
// with flow control, and during Close; to one without, PlainAgentCloseDelay
// later, once per tunnel (nil when one is on its way). Meanwhile the
// agent's DATA for it is dropped rather than answered with a CLOSE_REQ
// that would cut the wait short (onAgentData), and a graceful stop waits
// for it (openTunnels). Called with Server.mu held.
func (r *relay) closeReqLocked(t *tunnel) func() {
	be, id := t.be, t.connectID
	send := func() { be.peer.sendTunnelControl(wire.CloseReq(id), id) }
	if be.peerWindow > 0 || r.life.closed || be.gone {
		return send
	}
	be.connMu.Lock()
	_, waiting := be.closing[id]
	if !waiting {
		if be.closing == nil {
			be.closing = map[int64]struct{}{}
		}
		be.closing[id] = struct{}{}
	}
	be.connMu.Unlock()
	if waiting {
		return nil
	}
	// Under Server.mu with r.life.closed false, so that Close waits for
	// it: the HTTP CONNECT handler that may send it is not counted in
	// r.life.wg.
	r.life.wg.Add(1)
	return func() {
		time.AfterFunc(PlainAgentCloseDelay, func() {
			defer r.life.wg.Done()
			send()
			r.mu.Lock()
			be.connMu.Lock()
			delete(be.closing, id)
			be.connMu.Unlock()
			r.mu.Unlock()
			r.life.tunnelMayHaveEnded()
		})
	}
}
