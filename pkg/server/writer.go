package server

import (
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// A peer's writer: the one goroutine that calls stream.Send, started by
// whoever queues a packet and gone once both queues are empty.

// offer queues pkt on out if there is room now, and reports whether it
// did.
func (p *peer) offer(pkt *client.Packet) bool {
	select {
	case p.out <- pkt:
		p.put(pkt)
		return true
	default:
		return false
	}
}

// put accounts for pkt, just put on out, and kicks the writer. Whoever
// puts a packet on out calls it next.
func (p *peer) put(pkt *client.Packet) {
	p.queued.add(dataLen(pkt))
	p.enqueued.Add(1)
	p.kick()
}

// kick starts writeLoop unless one runs or the stream is done with
// writers. Whoever queues a packet calls it after queueing: a writer that
// finds both queues empty ends under writerMu, so that either it sees the
// packet or the kick that follows sees it gone.
func (p *peer) kick() {
	p.writerMu.Lock()
	defer p.writerMu.Unlock()
	if p.writing.Load() || p.stopped || p.ended.Load() {
		return
	}
	// moved first: stalled, which reads writing first, then reads the
	// moved of this start, not of the stream's last packet.
	p.moved.Store(time.Now().UnixNano())
	p.writing.Store(true)
	p.writers.Add(1)
	go p.writeLoop()
}

// stopWriter waits for the stream's end and then for its writer, and
// starts no other. The stream's receive goroutine calls it last, so that
// the Server, which waits for that goroutine, waits for the writer too.
func (p *peer) stopWriter() {
	<-p.done
	p.writerMu.Lock()
	p.stopped = true
	p.writerMu.Unlock()
	p.writers.Wait()
}

// idleWriter ends writeLoop if nothing is queued, and reports whether it
// did.
func (p *peer) idleWriter() bool {
	p.writerMu.Lock()
	defer p.writerMu.Unlock()
	if len(p.out) > 0 {
		return false
	}
	p.controlMu.Lock()
	queued := len(p.control) > 0
	p.controlMu.Unlock()
	if queued {
		return false
	}
	p.writing.Store(false)
	return true
}

// nextControl removes and returns the oldest control packet if it is due,
// or nil. Only writeLoop calls it, between sends: an empty out then means
// that every packet queued before any control packet has been sent. The
// queue is served in order: a packet behind one not yet due waits with
// it, late by a few packets at most.
func (p *peer) nextControl() *client.Packet {
	p.controlMu.Lock()
	defer p.controlMu.Unlock()
	if len(p.control) == 0 {
		return nil
	}
	first := p.control[0]
	if first.due > p.dequeued.Load() && len(p.out) > 0 {
		return nil
	}
	p.control[0] = controlPacket{}
	p.control = p.control[1:]
	if len(p.control) == 0 {
		p.control = nil // let the array go
	}
	delete(p.controlKeys, first.key)
	if first.untied {
		p.untied--
	}
	p.metrics.addControlQueued(-1)
	return first.pkt
}

// writeLoop sends queued packets until both queues are empty, the
// stream ends or a send fails. One runs at a time (kick).
func (p *peer) writeLoop() {
	defer p.writers.Done()
	for {
		pkt := p.nextControl()
		if pkt == nil {
			// A control packet not yet due waits for out to drain to
			// it: out is not empty then.
			select {
			case <-p.done:
				return
			case pkt = <-p.out:
				p.dequeued.Add(1)
			default:
				if p.idleWriter() {
					return
				}
				continue
			}
		}
		if p.ended.Load() {
			// The select may take a packet though done is closed too;
			// the handler may have returned: Send nothing.
			wire.Recycle(pkt.GetData().GetData())
			return
		}
		start := time.Now()
		err := p.stream.Send(pkt)
		now := time.Now().UnixNano()
		p.moved.Store(now)
		p.sent.Store(now)
		p.queued.add(-dataLen(pkt))           // control packets carry no data: 0
		wire.Recycle(pkt.GetData().GetData()) // Send has copied it
		if err != nil {
			p.metrics.streamError(p.segment, err, wire.PacketTypeName(pkt.GetType()))
			p.end(err)
			return
		}
		if p.segment == segmentToClient {
			p.metrics.observeFrontendWrite(time.Since(start))
		}
		p.metrics.packet(p.segment, pkt.GetType())
	}
}
