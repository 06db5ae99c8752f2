package server

import (
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// A peer's writer: the one goroutine that calls stream.Send, started by
// whoever queues a packet and gone once both queues are empty.

// offer queues pkt on the data queue if there is room now, and reports
// whether it did.
func (p *peer) offer(pkt *client.Packet) bool {
	select {
	case p.room <- struct{}{}:
		p.push(pkt)
		return true
	default:
		return false
	}
}

// push puts pkt on the data queue, for a sender that holds a token of
// room, and starts the writer if none runs. Counting the packet (put)
// under the same lock as the put is what keeps a control packet queued
// after it behind it (queueControl).
func (p *peer) push(pkt *client.Packet) {
	p.queued.add(dataLen(pkt))
	p.mu.Lock()
	p.data[(p.head+p.n)%queueSize] = pkt
	p.n++
	p.put++
	p.mu.Unlock()
	p.startWriter()
}

// startWriter starts writeLoop unless one runs or the stream is done
// with writers. Whoever queues a packet calls it, after (ondemand.Loop).
func (p *peer) startWriter() {
	if p.ended.Load() {
		return // a writer would Send nothing
	}
	p.writer.Kick(func() {
		// moved first: stalled, which reads Running first, then reads
		// the moved of this start, not of the stream's last packet.
		p.moved.Store(p.mono.Now())
		p.writers.Add(1)
		go p.writeLoop()
	})
}

// stopWriter waits for the stream's end and then for its writer, and
// starts no other. The stream's receive goroutine calls it last, so that
// the Server, which waits for that goroutine, waits for the writer too.
func (p *peer) stopWriter() {
	<-p.done
	p.writer.End()
	p.writers.Wait()
}

// next removes and returns the next packet to send: the oldest control
// packet once every data packet queued before it has been taken, else
// the oldest data packet; nil with both queues empty. Only writeLoop
// calls it, inside the writer's Next.
func (p *peer) next() *client.Packet {
	p.mu.Lock()
	defer p.mu.Unlock()
	// With the data queue empty taken == put, so the first control
	// packet is due.
	if len(p.control) > 0 && p.control[0].due <= p.taken {
		first := p.control[0]
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
	if p.n == 0 {
		return nil
	}
	pkt := p.data[p.head]
	p.data[p.head] = nil
	p.head = (p.head + 1) % queueSize
	p.n--
	p.taken++
	<-p.room // its token: a waiting sender may put one more
	return pkt
}

// writeLoop sends queued packets until both queues are empty, the
// stream ends or a send fails. One runs at a time (startWriter).
func (p *peer) writeLoop() {
	defer p.writers.Done()
	for {
		var pkt *client.Packet
		if !p.writer.Next(func() bool { pkt = p.next(); return pkt != nil }) {
			return // idle: the next queueing starts another
		}
		if p.ended.Load() {
			// The handler may have returned: Send nothing.
			wire.Recycle(pkt.GetData().GetData())
			return
		}
		start := time.Now()
		err := p.stream.Send(pkt)
		now := p.mono.Now()
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
