package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// errUnknownConnectID is the CLOSE_RSP error for DATA or CLOSE_REQ on a
// connectID the agent does not have (upstream words it the same way).
const errUnknownConnectID = "Unknown connectID"

// client is one Connect stream to one proxy-server, over its own gRPC
// connection, and the tunnels the server opened on it.
type client struct {
	cs          *ClientSet
	serverID    string
	serverCount int
	// peerWindow is the server's flow-control window per tunnel, 0 when
	// the handshake did not turn flow control on.
	peerWindow int
	// logger is the logger of the context the client was dialed in, with
	// the serverID.
	logger klog.Logger
	// addr is where the server was dialed; set before the client starts.
	addr   string
	cc     *grpc.ClientConn
	stream wire.AgentConnectClient
	// cancel ends the stream; safe to call more than once.
	cancel context.CancelFunc
	// done is closed when the receive loop has ended.
	done chan struct{}

	// sendMu serialises Send: a gRPC stream's Send is not safe for
	// concurrent use. It is never held while anything else is locked.
	sendMu sync.Mutex

	// drained makes DRAIN go out once.
	drained atomic.Bool

	// slots counts this stream's tunnels, dials in flight included,
	// bounded by MaxTunnelsPerServer: taken by admitDial on DIAL_REQ,
	// given back by releaseSlot when the dial fails or the tunnel ends.
	slots atomic.Int64

	// mu guards the fields below it.
	mu sync.Mutex
	// tunnels are the open endpoint connections by connectID. Guarded by
	// mu.
	tunnels map[int64]*tunnel
	// lastID is the last connectID given out; IDs start at 1. Guarded by
	// mu.
	lastID int64
	// closed is set when the stream has ended: no tunnel is added after.
	// Guarded by mu.
	closed bool

	// wg counts the dial and tunnel goroutines; the receive loop waits for
	// it before the client is gone.
	wg sync.WaitGroup
}

func newClient(ctx context.Context, cs *ClientSet, serverID string, serverCount int, cc *grpc.ClientConn, stream wire.AgentConnectClient, cancel context.CancelFunc) *client {
	return &client{
		cs:          cs,
		serverID:    serverID,
		serverCount: serverCount,
		logger:      klog.FromContext(ctx).WithValues("serverID", serverID),
		cc:          cc,
		stream:      stream,
		cancel:      cancel,
		done:        make(chan struct{}),
		tunnels:     make(map[int64]*tunnel),
	}
}

// closeUnstarted closes a client that was never run (a duplicate).
func (c *client) closeUnstarted() {
	c.cancel()
	_ = c.cc.Close() // nothing to do about an error: the connection is dropped
	close(c.done)
}

// ended reports whether the receive loop has ended.
func (c *client) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// send sends one packet on the stream.
func (c *client) send(p *pb.Packet) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.stream.Send(p); err != nil {
		c.cs.metrics.streamError(segmentToServer, err, wire.PacketTypeName(p.GetType()))
		return err
	}
	c.cs.metrics.packet(segmentToServer, p.GetType())
	return nil
}

// drain sends DRAIN, once.
func (c *client) drain() {
	if c.drained.Swap(true) {
		return
	}
	if err := c.send(wire.Drain()); err != nil {
		c.logger.V(2).Info("Failed to send DRAIN", "err", err)
	}
}

// run is the receive loop. When the stream ends it closes every tunnel,
// waits for their goroutines, closes the connection and removes the
// client from the ClientSet.
func (c *client) run(ctx context.Context, drain bool) {
	if drain {
		c.drain()
	}
	// The stream's context ends with the stream: dials and blocked writes
	// stop with it.
	err := c.receive(klog.NewContext(c.stream.Context(), c.logger))
	if ctx.Err() == nil {
		c.logger.V(2).Info("Lost proxy-server connection", "err", err)
	}

	c.cancel()
	c.mu.Lock()
	c.closed = true
	tunnels := c.tunnels
	c.tunnels = nil
	c.mu.Unlock()
	for _, t := range tunnels {
		t.finish(false)
	}
	c.wg.Wait()
	_ = c.cc.Close() // the connection is dropped either way
	c.cs.remove(c)
	close(c.done)
}

// receive reads packets until the stream ends.
func (c *client) receive(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for {
		p, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			c.cs.metrics.streamError(segmentFromServer, err, "UNKNOWN")
			return err
		}
		c.cs.metrics.packet(segmentFromServer, p.GetType())
		switch p.GetType() {
		case pb.PacketType_DIAL_REQ:
			req := p.GetDialRequest()
			logger.V(4).Info("Received DIAL_REQ", "protocol", req.GetProtocol(), "address", req.GetAddress(), "dialID", req.GetRandom())
			// Refused here, in the receive loop, before any goroutine or
			// socket: a server flooding DIAL_REQs costs one reply each.
			if reason, errText := c.admitDial(); reason != "" {
				c.cs.metrics.endpointDialFailed(reason)
				logger.V(2).Info("Refused DIAL_REQ", "reason", string(reason), "dialID", req.GetRandom())
				_ = c.sendDialRsp(req.GetRandom(), 0, errText) // a failed send ends the stream: Recv reports it
				continue
			}
			c.wg.Go(func() { c.dial(ctx, req) })
		case pb.PacketType_DATA:
			d := p.GetData()
			if t := c.tunnel(d.GetConnectID()); t != nil {
				if !t.closing {
					// Queued in pieces of at most MaxDataPayload, each
					// within the window or (without flow control)
					// waiting for room, so that a tunnel's queue holds
					// its bound in bytes whatever size the server sends.
					wire.SplitData(d.GetData(), func(piece []byte) bool {
						return t.enqueue(ctx, piece)
					})
				}
			} else {
				logger.V(4).Info("Received DATA for an unknown connectID", "connectID", d.GetConnectID())
				c.sendCloseRsp(d.GetConnectID(), errUnknownConnectID)
			}
		case pb.PacketType_CLOSE_REQ:
			id := p.GetCloseRequest().GetConnectID()
			logger.V(4).Info("Received CLOSE_REQ", "connectID", id)
			if t := c.tunnel(id); t != nil && !t.closing {
				t.closing = true
				t.closeAfterWrites()
			} else {
				c.sendCloseRsp(id, errUnknownConnectID)
			}
		case wire.PacketWindow:
			if id, n, ok := wire.ParseWindowUpdate(p); ok && c.peerWindow > 0 {
				if t := c.tunnel(id); t != nil && t.credit != nil {
					t.credit.Give(n)
				}
			} else {
				logger.V(4).Info("Ignored a WINDOW packet", "flowControl", c.peerWindow > 0)
			}
		case pb.PacketType_DIAL_CLS:
			// A frontend gave up on a pending dial. Our dial answers within
			// DialTimeout anyway and the server drops the unmatched reply.
			logger.V(4).Info("Ignored DIAL_CLS", "dialID", p.GetCloseDial().GetRandom())
		default:
			logger.V(4).Info("Ignored unexpected packet", "type", p.GetType().String())
		}
	}
}

// admitDial takes a tunnel slot of this stream and a dial slot of the
// agent for one DIAL_REQ. When either bound is reached it takes neither
// and returns the reason and the DIAL_RSP error text.
func (c *client) admitDial() (dialFailureReason, string) {
	limit := c.cs.cfg.MaxTunnelsPerServer
	if c.slots.Add(1) > int64(limit) {
		c.slots.Add(-1)
		return dialFailureTunnelLimit, fmt.Sprintf("proxy-agent refused the dial: %d tunnels open on this server stream, the most --max-tunnels-per-server allows", limit)
	}
	c.cs.tunnels.Add(1)
	if !c.cs.tryStartDial() {
		c.releaseSlot()
		return dialFailureDialLimit, fmt.Sprintf("proxy-agent refused the dial: %d endpoint dials in flight, the most --max-concurrent-dials allows; try again", c.cs.cfg.MaxConcurrentDials)
	}
	return "", ""
}

// releaseSlot gives back a tunnel slot taken by admitDial.
func (c *client) releaseSlot() {
	c.slots.Add(-1)
	c.cs.tunnels.Add(-1)
	select {
	case c.cs.tunnelEnded <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// tunnel returns the open tunnel with connectID id, or nil.
func (c *client) tunnel(id int64) *tunnel {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tunnels[id]
}

// forget removes t from the open tunnels, if it is still there.
func (c *client) forget(t *tunnel) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tunnels[t.connectID] == t {
		delete(c.tunnels, t.connectID)
	}
}

// sendCloseRsp answers CLOSE_RSP{id, errText}.
func (c *client) sendCloseRsp(id int64, errText string) {
	if err := c.send(wire.CloseRsp(id, errText)); err != nil {
		c.logger.V(4).Info("Failed to send CLOSE_RSP", "connectID", id, "err", err)
	}
}
