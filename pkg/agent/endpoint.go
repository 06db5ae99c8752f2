package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/klog/v2"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/pkg/wire"
)

// serveDialReq serves one DIAL_REQ: it dials the endpoint, answers DIAL_RSP and,
// on success, starts readLoop, which relays the endpoint's data to the
// server until the endpoint closes. It runs in its own goroutine, counted
// in c.wg, as readLoop does, holding the tunnel and dial slots admitDial
// took: the dial slot until the dial returns, the tunnel slot until the
// tunnel ends.
func (c *client) serveDialReq(ctx context.Context, req *pb.DialRequest) {
	logger := klog.FromContext(ctx).WithValues("address", req.GetAddress(), "dialID", req.GetRandom())
	start := time.Now()
	if c.peerHeartbeat > 0 {
		// A slow endpoint must not make the agent look deaf: the server
		// hears from it within wire.DialProgress of the DIAL_REQ.
		progress := time.AfterFunc(wire.DialProgress, func() { c.sendControl(wire.DialProgressHeartbeat(req.GetRandom()), req.GetRandom()) })
		defer progress.Stop()
	}
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
		q:         flow.NewBoundedQueue(plainQueueBytes),
		closed:    make(chan struct{}),
	}
	if c.peerWindow > 0 {
		t.q = flow.NewQueue(c.cs.cfg.TunnelWindow)
		t.credit = flow.NewWindow(c.peerWindow)
	}
	// In the map before DIAL_RSP goes out, so that DATA following it
	// finds the tunnel.
	c.tunnels[t.connectID] = t
	c.mu.Unlock()
	c.cs.metrics.endpointOpened()
	logger.V(4).Info("Dialed endpoint", "connectID", t.connectID)

	if err := c.sendDialRsp(req.GetRandom(), t.connectID, ""); err != nil {
		t.finish(false)
		return
	}
	// Only after DIAL_RSP: no DATA may precede it. In a goroutine of its
	// own, whose stack starts small: this one's grew for the dial, and an
	// idle tunnel would keep it.
	c.wg.Go(t.readLoop)
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
