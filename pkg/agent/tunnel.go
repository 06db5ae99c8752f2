package agent

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/internal/ondemand"
	"github.com/servercount/servercount/pkg/wire"
)

// Tunnel sizes and bounds.
//
// Data from the server is written to an endpoint by a writer goroutine of
// the tunnel's, fed by a byte queue (flow.Queue), so that the stream's
// receive loop does not wait for one endpoint's socket. The writer runs
// only while the queue holds data, and the reader holds a full-size
// buffer only while the endpoint sends: an idle tunnel costs one
// goroutine, blocked in Read on a small buffer.
//
// With a server that turned flow control on in the handshake, the server
// sends at most the agent's window of unwritten bytes per tunnel: the
// queue always has room and the receive loop never waits. An endpoint
// that does not read then holds up only its own tunnel, whose write
// times out after Config.EndpointWriteTimeout.
//
// Upstream's protocol has no flow control: when an endpoint reads slower
// than its server sends and its queue fills up, the receive loop waits for
// room (stalling the other tunnels of that stream: dropping data is not an
// option). That wait is bounded by EndpointWriteTimeout as a whole, and the
// tunnel is then closed with a CLOSE_RSP, which frees the receive loop.
const (
	// plainQueueBytes is the bytes queued per endpoint without flow
	// control.
	plainQueueBytes = 128 * wire.MaxDataPayload
	// writeChunk is the most one write to an endpoint carries: queued
	// packets are coalesced up to it.
	writeChunk = wire.MaxDataPayload
	// idleRead is the buffer an endpoint is read into while it sends
	// nothing. A read that fills it is followed by reads into a pooled
	// buffer of MaxDataPayload, until one comes back short.
	idleRead = 512
)

// tunnel is one endpoint connection, relayed over a client's stream as
// connectID.
type tunnel struct {
	c         *client
	connectID int64
	conn      net.Conn
	// q feeds the writer goroutine. Only the receive loop puts on it and
	// closes it for writing (on CLOSE_REQ).
	q *flow.Queue
	// credit is what the server has room for, nil without flow control.
	credit *flow.Window
	// closing is set on CLOSE_REQ. Owned by the receive loop: no other
	// goroutine reads or writes it.
	closing bool
	// closed is closed by finish: the tunnel is over.
	closed chan struct{}
	// finishOnce makes finish run once.
	finishOnce sync.Once

	// qmu guards queued and over. queued is the number of bytes queued
	// for the endpoint and not yet written, counted in the agent's
	// queued_bytes gauge; finish sets over and takes them out of the
	// gauge, after which nothing is counted, so that data left in q when
	// the tunnel ends is not counted for ever.
	qmu    sync.Mutex
	queued int
	over   bool
	// writer runs writeLoop while q holds something (see kick); finish
	// ends it.
	writer ondemand.Loop
}

// account adds n (negative: subtracts) to the bytes queued for the
// endpoint. It reports false, counting nothing, once the tunnel is over.
func (t *tunnel) account(n int) bool {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if t.over {
		return false
	}
	t.queued += n
	t.c.cs.metrics.addQueuedBytes(n)
	return true
}

// readLoop sends what the endpoint sends as DATA, until it closes. With
// flow control it reads no more than the server has room for. It reads
// into a small buffer of its own while the endpoint is quiet, and into a
// pooled one of MaxDataPayload while reads fill what they are given: Send
// marshals the packet before it returns, so either buffer is free again
// after it. (A gRPC stats handler in DialOptions that kept the message
// past HandleRPC would see it change.)
func (t *tunnel) readLoop() {
	small := make([]byte, idleRead)
	busy := false
	p := wire.Data(t.connectID, nil)
	data := p.GetData()
	for {
		max := len(small)
		if busy {
			max = wire.MaxDataPayload
		}
		if t.credit != nil {
			// Before the buffer: a tunnel whose frontend stopped reading
			// waits here, holding none.
			max = t.credit.Take(max, t.closed)
		}
		buf := small
		if busy && max > 0 {
			buf = wire.DataBuffer()
		}
		n, err := 0, error(nil)
		if max > 0 {
			n, err = t.conn.Read(buf[:max])
		}
		if t.credit != nil {
			t.credit.Give(max - n)
		}
		var serr error
		if n > 0 {
			data.Data = buf[:n]
			serr = t.c.send(p)
			data.Data = nil
		}
		if busy && max > 0 {
			wire.Recycle(buf)
		}
		switch {
		case max == 0:
			return // finished elsewhere
		case serr != nil:
			t.finish(false) // the stream is broken: no CLOSE_RSP can go out
			return
		case err != nil:
			// EOF or error from the endpoint, or the tunnel was finished
			// elsewhere; finish does its work once.
			t.finish(true)
			return
		}
		busy = n == max
	}
}

// kick starts the tunnel's writer unless it runs already or the tunnel
// is over. The receive loop calls it after each Put and CloseWrite.
func (t *tunnel) kick() {
	t.writer.Kick(func() { t.c.wg.Go(t.writeLoop) })
}

// writeLoop writes queued data to the endpoint and, with flow control,
// grants the server credit for what it wrote, until the queue is empty.
// When the queue is closed for writing (CLOSE_REQ) it finishes the tunnel
// once the queued data is written.
func (t *tunnel) writeLoop() {
	for {
		var b []byte
		if !t.writer.Next(func() bool {
			var more bool
			b, more = t.q.TryNext(writeChunk)
			return b != nil || !more
		}) {
			return // idle: the next kick starts another
		}
		if b == nil {
			t.finish(true) // once: nothing if the tunnel is over already
			return
		}
		if err := t.conn.SetWriteDeadline(time.Now().Add(t.c.cs.cfg.EndpointWriteTimeout)); err != nil {
			t.finish(true)
			return
		}
		_, err := t.conn.Write(b)
		t.account(-len(b))
		wire.Recycle(b) // a packet's whole data, or the queue's copy
		if err != nil {
			t.c.logger.V(4).Info("Failed to write to endpoint", "connectID", t.connectID, "err", err)
			t.finish(true)
			return
		}
		if grant := t.q.Release(len(b)); grant > 0 && t.credit != nil {
			if err := t.c.send(wire.WindowUpdate(t.connectID, grant)); err != nil {
				return // the stream is broken: the receive loop ends every tunnel
			}
		}
	}
}

// enqueue queues data for the endpoint. Called only by the receive loop,
// with at most MaxDataPayload bytes (see wire.SplitData). It reports
// whether b was queued.
//
// With flow control it never waits: a server that sends more than the
// window loses the tunnel. Without, it waits while the queue is full,
// until the tunnel or the stream ends; see Config.EndpointWriteTimeout.
func (t *tunnel) enqueue(ctx context.Context, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	// Counted before it is queued, so that writeLoop never subtracts
	// bytes not yet added.
	if !t.account(len(b)) {
		return false
	}
	var timer *time.Timer
	for {
		err := t.q.Put(b)
		if err == nil {
			t.kick()
			return true
		}
		if !errors.Is(err, flow.ErrWindowExceeded) {
			break // the tunnel is over
		}
		if t.credit != nil {
			klog.FromContext(ctx).V(2).Info("Closed a tunnel whose server sent more than the flow-control window", "connectionID", t.connectID, "window", t.c.cs.cfg.TunnelWindow)
			t.finish(true)
			break
		}
		// The queue is full: the endpoint reads slower than the server
		// sends. Waiting holds up every tunnel on this stream, so the
		// wait is bounded as a whole, not per write: an endpoint that
		// cannot take one more packet in EndpointWriteTimeout loses its
		// tunnel, even if it trickles.
		if timer == nil {
			timer = time.NewTimer(t.c.cs.cfg.EndpointWriteTimeout)
			defer timer.Stop()
		}
		select {
		case <-t.q.Room():
			continue
		case <-t.closed:
		case <-ctx.Done():
		case <-timer.C:
			klog.FromContext(ctx).V(2).Info("Closed a tunnel whose endpoint fell behind", "connectionID", t.connectID, "waited", t.c.cs.cfg.EndpointWriteTimeout)
			t.finish(true)
		}
		break
	}
	t.account(-len(b))
	return false
}

// closeAfterWrites ends the tunnel after the data queued so far is
// written. Called only by the receive loop, once.
func (t *tunnel) closeAfterWrites() {
	t.q.CloseWrite()
	t.kick()
}

// finish ends the tunnel once: it forgets it, closes the endpoint
// connection and, if sendRsp, tells the server with CLOSE_RSP.
func (t *tunnel) finish(sendRsp bool) {
	t.finishOnce.Do(func() {
		t.c.forget(t)
		t.writer.End() // first: no writer starts for a tunnel that is over
		t.qmu.Lock()
		t.over = true
		t.c.cs.metrics.addQueuedBytes(-t.queued)
		t.queued = 0
		t.qmu.Unlock()
		t.q.Close()
		close(t.closed)
		_ = t.conn.Close() // a close error changes nothing for the tunnel
		t.c.cs.metrics.endpointClosed()
		t.c.releaseSlot()
		if sendRsp {
			t.c.sendTunnelControl(wire.CloseRsp(t.connectID, ""), t.connectID)
		}
	})
}
