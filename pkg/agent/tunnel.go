package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/klog/v2"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// Tunnel sizes and bounds.
//
// Data from the server is written to an endpoint by a writer goroutine per
// tunnel, fed by a queue of tunnelQueueLen packets, so that the stream's
// receive loop does not wait for one endpoint's socket. The protocol has no
// per-tunnel flow control, so when an endpoint reads slower than its
// server sends and its queue fills up, the receive loop waits for room
// (stalling the other tunnels of that stream: dropping data is not an
// option). That wait is bounded: a write to an endpoint that makes no
// progress for tunnelWriteTimeout fails, and the tunnel is closed with a
// CLOSE_RSP, which frees the receive loop.
const (
	// tunnelQueueLen is the number of DATA packets queued per endpoint.
	tunnelQueueLen = 128
	// tunnelWriteTimeout bounds one write to an endpoint.
	tunnelWriteTimeout = 10 * time.Second
)

// tunnel is one endpoint connection, relayed over a client's stream as
// connectID.
type tunnel struct {
	c         *client
	connectID int64
	conn      net.Conn
	// writeq feeds the writer goroutine. Only the receive loop sends on
	// it, and only the receive loop closes it (on CLOSE_REQ).
	writeq chan []byte
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
	// gauge, after which nothing is counted, so that data left in writeq
	// when the tunnel ends is not counted for ever.
	qmu    sync.Mutex
	queued int
	over   bool
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

// dial serves one DIAL_REQ: it dials the endpoint, answers DIAL_RSP and,
// on success, relays the endpoint's data to the server until the endpoint
// closes. It runs in its own goroutine, counted in c.wg, holding the
// tunnel and dial slots admitDial took: the dial slot until the dial
// returns, the tunnel slot until the tunnel ends.
func (c *client) dial(ctx context.Context, req *pb.DialRequest) {
	logger := klog.FromContext(ctx).WithValues("address", req.GetAddress(), "dialID", req.GetRandom())
	start := time.Now()
	conn, err := c.dialEndpoint(ctx, req.GetProtocol(), req.GetAddress())
	c.cs.endDial()
	if err == nil {
		c.cs.metrics.endpointDialed(time.Since(start))
	}
	if err != nil {
		c.releaseSlot()
		reason := dialFailureUnknown
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			reason = dialFailureTimeout
		}
		c.cs.metrics.endpointDialFailed(reason)
		logger.V(2).Info("Failed to dial endpoint", "reason", string(reason), "err", err)
		c.sendDialRsp(req.GetRandom(), 0, err.Error())
		return
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = conn.Close() // the stream is gone: nobody to relay for
		c.releaseSlot()
		return
	}
	c.lastID++
	t := &tunnel{
		c:         c,
		connectID: c.lastID,
		conn:      conn,
		writeq:    make(chan []byte, tunnelQueueLen),
		closed:    make(chan struct{}),
	}
	// In the map before DIAL_RSP goes out, so that DATA following it
	// finds the tunnel.
	c.tunnels[t.connectID] = t
	c.mu.Unlock()
	c.cs.metrics.endpointOpened()
	logger.V(4).Info("Dialed endpoint", "connectID", t.connectID)

	c.wg.Go(t.writeLoop)
	if err := c.sendDialRsp(req.GetRandom(), t.connectID, ""); err != nil {
		t.finish(false)
		return
	}
	// Only after DIAL_RSP: no DATA may precede it.
	t.readLoop()
}

// dialEndpoint dials a TCP endpoint with DialTimeout.
func (c *client) dialEndpoint(ctx context.Context, protocol, address string) (net.Conn, error) {
	switch protocol {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("dial %s %q: unsupported protocol, want tcp", protocol, address)
	}
	d := net.Dialer{Timeout: c.cs.cfg.DialTimeout}
	return d.DialContext(ctx, protocol, address)
}

// sendDialRsp answers DIAL_RSP; errText empty means success.
func (c *client) sendDialRsp(random, connectID int64, errText string) error {
	err := c.send(wire.DialRsp(random, connectID, errText))
	if err != nil {
		c.logger.V(4).Info("Failed to send DIAL_RSP", "dialID", random, "err", err)
	}
	return err
}

// readLoop sends what the endpoint sends as DATA, until it closes.
func (t *tunnel) readLoop() {
	// One buffer for the tunnel's life: Send marshals the packet before it
	// returns, so the buffer is free again. (A gRPC stats handler in
	// DialOptions that kept the message past HandleRPC would see it
	// change.)
	buf := make([]byte, wire.MaxDataPayload)
	p := wire.Data(t.connectID, nil)
	data := p.GetData()
	for {
		n, err := t.conn.Read(buf)
		if n > 0 {
			data.Data = buf[:n]
			if serr := t.c.send(p); serr != nil {
				t.finish(false) // the stream is broken: no CLOSE_RSP can go out
				return
			}
		}
		if err != nil {
			// EOF or error from the endpoint, or the tunnel was finished
			// elsewhere; finish does its work once.
			t.finish(true)
			return
		}
	}
}

// writeLoop writes queued data to the endpoint. When the queue is closed
// (CLOSE_REQ) it finishes the tunnel once the queued data is written.
func (t *tunnel) writeLoop() {
	for {
		select {
		case b, ok := <-t.writeq:
			if !ok {
				t.finish(true)
				return
			}
			if err := t.conn.SetWriteDeadline(time.Now().Add(tunnelWriteTimeout)); err != nil {
				t.finish(true)
				return
			}
			_, err := t.conn.Write(b)
			t.account(-len(b))
			if err != nil {
				t.c.logger.V(4).Info("Failed to write to endpoint", "connectID", t.connectID, "err", err)
				t.finish(true)
				return
			}
		case <-t.closed:
			return
		}
	}
}

// enqueue queues data for the endpoint. It waits while the queue is full,
// until the tunnel or the stream ends; see tunnelWriteTimeout. Called only
// by the receive loop, with at most MaxDataPayload bytes (see
// wire.SplitData). It reports whether b was queued.
func (t *tunnel) enqueue(ctx context.Context, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	// Counted before it is queued, so that writeLoop never subtracts
	// bytes not yet added.
	if !t.account(len(b)) {
		return false
	}
	select {
	case t.writeq <- b:
		return true
	default:
	}
	// The queue is full: the endpoint reads slower than the server sends.
	// Waiting holds up every tunnel on this stream, so the wait is bounded
	// as a whole, not per write: an endpoint that cannot take one more
	// packet in tunnelWriteTimeout loses its tunnel, even if it trickles.
	timer := time.NewTimer(tunnelWriteTimeout)
	defer timer.Stop()
	select {
	case t.writeq <- b:
		return true
	case <-t.closed:
	case <-ctx.Done():
	case <-timer.C:
		klog.FromContext(ctx).V(2).Info("Closed a tunnel whose endpoint fell behind", "connectionID", t.connectID, "waited", tunnelWriteTimeout)
		t.finish(true)
	}
	t.account(-len(b))
	return false
}

// closeAfterWrites ends the tunnel after the data queued so far is
// written. Called only by the receive loop, once.
func (t *tunnel) closeAfterWrites() { close(t.writeq) }

// finish ends the tunnel once: it forgets it, closes the endpoint
// connection and, if sendRsp, tells the server with CLOSE_RSP.
func (t *tunnel) finish(sendRsp bool) {
	t.finishOnce.Do(func() {
		t.c.forget(t)
		t.qmu.Lock()
		t.over = true
		t.c.cs.metrics.addQueuedBytes(-t.queued)
		t.queued = 0
		t.qmu.Unlock()
		close(t.closed)
		_ = t.conn.Close() // a close error changes nothing for the tunnel
		t.c.cs.metrics.endpointClosed()
		t.c.releaseSlot()
		if sendRsp {
			t.c.sendCloseRsp(t.connectID, "")
		}
	})
}
