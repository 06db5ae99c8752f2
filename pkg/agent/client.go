package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

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
	// peerHeartbeat is the server's heartbeat interval, 0 when the
	// handshake did not turn heartbeats on.
	peerHeartbeat time.Duration
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
	// concurrent use. It is never held while anything else is locked, and
	// the receive loop never takes it (see the package doc).
	sendMu sync.Mutex
	// senders counts the goroutines in send, waiting for sendMu or in
	// Send; moved is when a packet last moved on the stream, in or out.
	// Both for the liveness backstop, see stalled. These times, and those
	// below, are readings of ClientSet.mono: the monotonic clock.
	senders atomic.Int32
	moved   atomic.Int64
	// sent is when a packet was last sent: a stream
	// on which nothing was sent for half the heartbeat interval answers
	// the server's, and one idle for 1.5 intervals gets one unprompted.
	sent atomic.Int64
	// waiting is when the receive loop began to wait for the next
	// packet, 0 while it handles one; handling is when it began to
	// handle one, 0 while it waits. A server is
	// silent only while the loop waits, and the loop is stuck only while
	// it handles: see checkLiveness.
	waiting, handling atomic.Int64
	// dropped is set when the stream is given up on (dead, stuck or
	// failed): it no longer counts as held while its tunnels wind down,
	// and a new stream to the same server may take its place.
	dropped atomic.Bool

	// controlReady wakes controlLoop when sendControl queues a packet;
	// buffer of 1.
	controlReady chan struct{}
	controlMu    sync.Mutex
	// control holds the replies the receive loop and the tunnels queue
	// without waiting (CLOSE_RSP, refused DIAL_RSP), oldest first, for
	// controlLoop to send; controlKeys has one key per queued packet, so
	// that the same answer is not queued twice; sending is 1 while
	// controlLoop sends one it has taken. Guarded by controlMu.
	control     []*pb.Packet
	controlKeys map[controlKey]bool // true for a packet maxControl counts
	sending     int
	// untied counts the packets queued or being sent that maxControl
	// counts. Guarded by controlMu.
	untied int
	// controlOver is set when controlLoop has ended: nothing is queued
	// after. Guarded by controlMu.
	controlOver bool

	// drained makes DRAIN go out once.
	drained atomic.Bool
	// serverDraining is set when the server sent DRAIN: it is shutting
	// down, and another server is sought in its place.
	serverDraining atomic.Bool

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

		controlReady: make(chan struct{}, 1),
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

// send sends one packet on the stream. Only goroutines of their own
// (dials, tunnels, controlLoop) call it: it may wait for gRPC flow
// control for as long as the server does not read.
func (c *client) send(p *pb.Packet) error {
	c.senders.Add(1)
	defer c.senders.Add(-1)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	err := c.stream.Send(p)
	now := c.cs.mono.Now()
	c.moved.Store(now)
	c.sent.Store(now)
	if err != nil {
		c.cs.metrics.streamError(segmentSent, err, wire.PacketTypeName(p.GetType()))
		return err
	}
	c.cs.metrics.packet(segmentSent, p.GetType())
	return nil
}

// maxControl bounds the answers a stream queues that no tunnel of its own
// accounts for (CLOSE_RSP for unknown connections, refused DIAL_RSPs,
// heartbeats). A server that reads its stream keeps them near empty; one
// that leaves maxControl unread has not read for as long as it took to
// send that many packets for distinct connections, and the stream is
// ended. The CLOSE_RSP of a tunnel the stream held is outside the bound:
// MaxTunnelsPerServer bounds those, so a server that closes every tunnel
// at once over a slow link keeps the stream.
const maxControl = 4096

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
	// The stream's context ends with the stream: dials, blocked writes
	// and controlLoop stop with it.
	now := c.cs.mono.Now()
	c.moved.Store(now)
	c.sent.Store(now)
	c.wg.Go(func() { c.controlLoop(c.stream.Context()) })
	err := c.receive(klog.NewContext(c.stream.Context(), c.logger))
	switch {
	case ctx.Err() != nil, c.dropped.Load():
		// The agent stops, or gave up on the stream and said why.
	case err != nil:
		// The transport failed (a keepalive that went unanswered, a
		// reset): a server lost, which an operator is to see.
		if c.giveUp() {
			c.logger.Info("Lost proxy-server connection; the agent will connect again", "address", c.addr, "err", err)
		}
	default:
		if c.giveUp() {
			c.logger.V(2).Info("Proxy-server ended the stream", "address", c.addr)
		}
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
	defer c.handling.Store(0) // a loop that has ended is not stuck
	for {
		c.handling.Store(0)
		c.waiting.Store(c.cs.mono.Now())
		p, err := c.stream.Recv()
		now := c.cs.mono.Now()
		c.waiting.Store(0)
		c.handling.Store(now)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			// Counted as upstream's agent counts it, its own stop
			// (Canceled) included.
			c.cs.metrics.streamError(segmentReceived, err, wire.PacketTypeNone)
			if status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		c.moved.Store(now)
		c.cs.metrics.packet(segmentReceived, p.GetType())
		c.handle(ctx, logger, p)
	}
}

// handle is what receive does with packet p from the server. It never
// waits for the server: a DIAL_REQ is refused or dialled in a goroutine of
// its own, DATA waits only for its tunnel's room, and replies go through
// the control queue.
func (c *client) handle(ctx context.Context, logger klog.Logger, p *pb.Packet) {
	switch p.GetType() {
	case pb.PacketType_DIAL_REQ:
		req := p.GetDialRequest()
		logger.V(4).Info("Received DIAL_REQ", "protocol", req.GetProtocol(), "address", req.GetAddress(), "dialID", req.GetRandom())
		// Refused here, in the receive loop, before any goroutine or
		// socket: a server flooding DIAL_REQs costs one reply each.
		if reason, errText := c.admitDial(); reason != "" {
			c.cs.metrics.endpointDialFailed(reason)
			logger.V(2).Info("Refused DIAL_REQ", "reason", string(reason), "dialID", req.GetRandom())
			c.sendControl(wire.DialRsp(req.GetRandom(), 0, errText), req.GetRandom())
			return
		}
		c.wg.Go(func() { c.serveDialReq(ctx, req) })
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
	case pb.PacketType_DRAIN:
		// Ours sends it when it shuts down gracefully (upstream's
		// servers never do): its tunnels go on until they end, and
		// the sync loop connects to another server meanwhile.
		if !c.serverDraining.Swap(true) {
			logger.V(2).Info("Proxy-server is shutting down: its tunnels finish, and another server is sought")
			c.cs.recount()
			c.cs.wakeSync()
		}
	case wire.PacketHeartbeat:
		c.heartbeatIfIdle(c.cs.mono.Now(), c.cs.cfg.Heartbeat/2)
	case pb.PacketType_DIAL_CLS:
		// A frontend gave up on a pending dial. Our dial answers within
		// DialTimeout anyway and the server drops the unmatched reply.
		logger.V(4).Info("Ignored DIAL_CLS", "dialID", p.GetCloseDial().GetRandom())
	default:
		logger.V(4).Info("Ignored unexpected packet", "type", p.GetType().String())
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

// sendCloseRsp answers CLOSE_RSP{id, errText}, without waiting.
func (c *client) sendCloseRsp(id int64, errText string) {
	c.sendControl(wire.CloseRsp(id, errText), id)
}
