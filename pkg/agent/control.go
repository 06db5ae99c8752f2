package agent

import (
	"context"
	"time"

	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// controlKey names what a control packet answers: its type and its
// connection ID (or dial random).
type controlKey struct {
	typ pb.PacketType
	id  int64
}

// sendControl queues p, an answer without data that no tunnel of the
// stream accounts for, for controlLoop, without waiting: that is how the
// receive loop answers, so that it never waits on its own peer's send
// path. A packet with the same type and ID as one still queued is
// dropped: the queued one says the same. A server that leaves maxControl
// such answers unread loses the stream.
func (c *client) sendControl(p *pb.Packet, id int64) { c.queueControl(p, id, true) }

// sendTunnelControl is sendControl for the CLOSE_RSP of a tunnel the
// stream held: MaxTunnelsPerServer bounds these, not maxControl. A slot
// freed by a closed tunnel may take a new one before its CLOSE_RSP is
// sent, so the queue as a whole is bounded too, by the sum of the two.
func (c *client) sendTunnelControl(p *pb.Packet, id int64) { c.queueControl(p, id, false) }

func (c *client) queueControl(p *pb.Packet, id int64, untied bool) {
	key := controlKey{p.GetType(), id}
	c.controlMu.Lock()
	if _, dup := c.controlKeys[key]; dup || c.controlOver {
		c.controlMu.Unlock()
		return
	}
	limit := maxControl + c.cs.cfg.MaxTunnelsPerServer
	if queued := len(c.controlKeys) + c.sending; untied && c.untied >= maxControl || queued >= limit {
		c.controlMu.Unlock()
		c.drop(streamEndedControlBacklog, "Ended a proxy-server stream whose server left too many answers unread; the agent will connect again",
			"queued", queued, "unrelatedLimit", maxControl, "limit", limit)
		return
	}
	if c.controlKeys == nil {
		c.controlKeys = map[controlKey]bool{}
	}
	c.controlKeys[key] = untied
	if untied {
		c.untied++
	}
	c.control = append(c.control, p)
	c.controlMu.Unlock()
	c.cs.metrics.addControlQueued(1)
	select {
	case c.controlReady <- struct{}{}:
	default: // controlLoop is woken already
	}
}

// controlLoop sends the control queue until ctx, the stream's, ends, and
// is the stream's liveness backstop: a stream on which nothing has moved
// for StreamStallTimeout while packets wait to be sent is stuck, whatever
// the cause, and is ended, so that the agent dials the server again.
func (c *client) controlLoop(ctx context.Context) {
	defer c.dropControl()
	var tick <-chan time.Time
	if d := c.cs.cfg.StreamStallTimeout; d > 0 {
		ticker := time.NewTicker(d / 4)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			if c.stalled(c.cs.cfg.StreamStallTimeout) {
				c.drop(streamEndedStalled, "Ended a proxy-server stream on which nothing moved while packets waited; the agent will connect again", "stallTimeout", c.cs.cfg.StreamStallTimeout)
				return
			}
		case <-c.controlReady:
			for {
				c.controlMu.Lock()
				if len(c.control) == 0 {
					c.controlMu.Unlock()
					break
				}
				p := c.control[0]
				c.control[0] = nil
				c.control = c.control[1:]
				if len(c.control) == 0 {
					c.control = nil // let the array go
				}
				// Its key goes once it is taken: the peer may have it and
				// ask again before send returns, and the answer to that
				// (a CLOSE_RSP with an error, say) is not this one.
				key := controlKey{p.GetType(), controlID(p)}
				untied := c.controlKeys[key]
				delete(c.controlKeys, key)
				c.sending = 1
				c.controlMu.Unlock()
				err := c.send(p)
				c.controlMu.Lock()
				c.sending = 0
				if untied {
					c.untied--
				}
				c.controlMu.Unlock()
				c.cs.metrics.addControlQueued(-1)
				if err != nil {
					c.logger.V(4).Info("Failed to send an answer", "type", p.GetType().String(), "err", err)
					return // the stream is broken: the receive loop sees it
				}
			}
		}
	}
}

// controlID is the ID a control packet is keyed by: a DIAL_RSP's random
// (and a dial-progress HEARTBEAT's: 0 for a plain one), else a
// CLOSE_RSP's connectID.
func controlID(p *pb.Packet) int64 {
	if p.GetType() == pb.PacketType_DIAL_RSP || p.GetType() == wire.PacketHeartbeat {
		return p.GetDialResponse().GetRandom()
	}
	return p.GetCloseResponse().GetConnectID()
}

// dropControl empties the control queue of a stream that has ended.
func (c *client) dropControl() {
	c.controlMu.Lock()
	defer c.controlMu.Unlock()
	c.cs.metrics.addControlQueued(-len(c.control))
	c.control, c.controlKeys, c.untied, c.controlOver = nil, nil, 0, true
}
