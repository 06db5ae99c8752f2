package server

import (
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// pendingDials is the part of a Server that holds the dials sent to
// agents and not yet answered: by random, for a frontend's DIAL_CLS and
// the sweep, and on each agent stream (agentStream.pending), for its
// DIAL_RSPs; each with the timer of its attempt, and sent to another
// agent once at most. It starts a frontend's dial (start), ends it when
// the frontend gives up (cancel) or the agent answers (answer), and
// retries or fails it when the agent does not (timedOut); an answered
// dial becomes the relay's tunnel.
//
// Its state is guarded by Server.mu (mu), not a lock of its own: a dial's
// answer changes the dial, its agent stream's answer count and whether
// that agent is taken for unresponsive (the sweep's) together.
type pendingDials struct {
	mu       *sync.Mutex // Server.mu
	byRandom map[int64]*tunnel
	// strategies are Config.Strategies, in the order they are tried.
	strategies []Strategy
	routes     *routes
	live       *liveness
	relay      *relay
	life       *lifecycle
	metrics    *metrics
	log        klog.Logger
	// timeout is Config.BackendDialTimeout (0: none).
	timeout time.Duration
}

// start chooses an agent for a dial to address over protocol and records
// a pending dial for fe. A zero random means "choose one" (for HTTP
// CONNECT). The caller then queues the DIAL_REQ on the returned stream,
// which is t.be as start returns (t.be may change later, if the dial is
// retried).
func (d *pendingDials) start(fe frontend, protocol, address string, random int64) (*tunnel, *agentStream, error) {
	key := dialHostKey(address)
	for {
		// Chosen without Server.mu; a stream that ended or stopped
		// answering since is chosen again.
		be, tier, st := d.routes.choose(d.strategies, key, nil)
		d.mu.Lock()
		if be != nil && (be.gone || tier < tierUnresponsive && !be.unresponsive.IsZero()) {
			// It ended, or was taken for unresponsive, meanwhile.
			d.mu.Unlock()
			continue
		}
		t, err := d.startLocked(fe, be, st, protocol, address, random)
		d.mu.Unlock()
		if err != nil {
			return nil, nil, err
		}
		return t, be, nil
	}
}

// startLocked records a pending dial on be, found by strategy st (nil
// when none found one). Called with Server.mu held.
func (d *pendingDials) startLocked(fe frontend, be *agentStream, st Strategy, protocol, address string, random int64) (*tunnel, error) {
	if d.life.stoppingLocked() {
		return nil, errShuttingDown
	}
	if random == 0 {
		random = d.unusedRandom()
	} else if d.byRandom[random] != nil {
		d.metrics.observeDuplicateDial()
		return nil, errDuplicateDial
	}
	if be == nil {
		d.metrics.observeDialFailure(dialFailureNoAgent)
		return nil, errNoAgent
	}
	t := &tunnel{fe: fe, be: be, random: random, protocol: protocol, address: address, strategy: st, dialed: time.Now()}
	d.add(t)
	fe.track(t)
	return t, nil
}

// timedOut handles a dial whose agent did not answer within
// Config.BackendDialTimeout (of attempt): it is sent to another agent if
// it can be (retry), else answered with an error. A late DIAL_RSP then
// finds no pending dial, and a connection it opened is closed. An agent
// that leaves backendDialTimeouts dials in a row unanswered is taken for
// unresponsive.
func (d *pendingDials) timedOut(t *tunnel, attempt int) {
	d.mu.Lock()
	if d.life.closed || d.byRandom[t.random] != t || t.attempt != attempt {
		d.mu.Unlock()
		return
	}
	be := t.be
	be.timeouts++
	var sends []func()
	if be.timeouts >= backendDialTimeouts {
		sends = d.live.markUnresponsiveLocked(be, time.Now(), "dials in a row timed out")
	}
	if send, ok := d.retry(t, retryTimeout); ok {
		sends = append(sends, send)
		d.mu.Unlock()
		for _, send := range sends {
			send()
		}
		return
	}
	d.drop(t, dialFailureBackendDialTimeout)
	d.life.wg.Add(1)
	d.mu.Unlock()
	defer d.life.wg.Done()
	for _, send := range sends {
		send()
	}
	d.log.V(2).Info("Backend dial timed out", "agentID", be.logID, "dialID", t.random, "timeout", d.timeout)
	t.fe.answer(wire.DialRsp(t.random, 0, errTextDialTimeout))
}

// cancel drops fe's pending dial random (DIAL_CLS, or the frontend gave
// up).
func (d *pendingDials) cancel(fe frontend, random int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.byRandom[random]; t != nil && t.fe == fe {
		d.drop(t, dialFailureFrontendClose)
	}
}

// answer handles DIAL_RSP from agent stream be: a dial of be's that
// succeeded becomes a tunnel (relay.establishLocked), and its frontend
// gets the answer.
func (d *pendingDials) answer(be *agentStream, pkt *client.Packet) {
	rsp := pkt.GetDialResponse()
	d.mu.Lock()
	t := be.pending[rsp.GetRandom()]
	// Even a late answer is an answer: the agent is responsive.
	d.live.answeredLocked(be)
	if t == nil {
		d.mu.Unlock()
		d.metrics.observeDialFailure(dialFailureUnrecognizedResponse)
		d.log.V(2).Info("Dial response matched no pending dial", "agentID", be.logID, "dialID", rsp.GetRandom(), "connectionID", rsp.GetConnectID())
		if id := rsp.GetConnectID(); id != 0 {
			be.peer.sendControl(wire.CloseReq(id), id)
		}
		return
	}
	failed := rsp.GetError() != "" || rsp.GetConnectID() == 0
	reason := dialFailureReason("")
	if failed {
		reason = dialFailureErrorResponse
	}
	d.drop(t, reason)
	if failed {
		d.mu.Unlock()
		t.fe.answer(pkt)
		return
	}
	t.connectID = rsp.GetConnectID()
	if !d.relay.establishLocked(t) {
		d.metrics.observeDuplicateDial()
		d.mu.Unlock()
		// About the dial this stream held: one per dial.
		be.peer.sendTunnelControl(wire.CloseReq(t.connectID), t.connectID)
		t.fe.answer(wire.DialRsp(t.random, 0, errTextDuplicateID))
		return
	}
	d.mu.Unlock()
	t.fe.answer(pkt)
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

// drop forgets t everywhere, if it is pending (its frontend too), and
// counts it as a failure for reason ("" for none). It reports whether t
// was pending. Called with Server.mu held.
func (d *pendingDials) drop(t *tunnel, reason dialFailureReason) bool {
	if d.byRandom[t.random] != t {
		return false
	}
	delete(d.byRandom, t.random)
	delete(t.be.pending, t.random)
	if t.timer != nil {
		t.timer.Stop()
	}
	d.metrics.addPendingDials(-1)
	t.fe.forget(t)
	d.life.tunnelMayHaveEnded()
	if reason != "" {
		d.metrics.observeDialFailure(reason)
	}
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
