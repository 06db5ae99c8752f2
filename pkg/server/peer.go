package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// queueSize is the number of packets a stream's send queue holds. Packets
// carry at most wire.MaxDataPayload of data each, as larger DATA from a
// peer is split before it is queued (wire.SplitData), so a full queue is
// about 1 MiB whatever peers send.
const queueSize = 32

var (
	// errShuttingDown ends streams when the Server closes.
	errShuttingDown = errors.New("proxy-server is shutting down")
	// errSlowFrontend ends a frontend that did not take packets for
	// Config.FrontendWriteTimeout.
	errSlowFrontend = errors.New("frontend did not read its packets in time")
	// errPeerGone is returned when queueing on a stream that has ended.
	errPeerGone = errors.New("stream ended")
)

// packetStream is the server's side of an agent or frontend stream.
type packetStream = grpc.BidiStreamingServer[client.Packet, client.Packet]

// peer is one gRPC stream, agent or frontend, seen from the server. Its
// writer goroutine is the only caller of stream.Send, so sends are
// serialised without a lock held while sending.
type peer struct {
	stream packetStream
	out    chan *client.Packet // the send queue, read by writeLoop
	done   chan struct{}       // closed by end, once
	once   sync.Once
	reason error // why the stream ended; written in once before done closes, read after

	// dequeued counts the packets writeLoop has taken from out; see
	// sendLate.
	dequeued atomic.Uint64
	// lateReady wakes writeLoop when sendLate adds a packet; buffer of 1.
	lateReady chan struct{}
	lateMu    sync.Mutex
	// late holds the packets of sendLate with the value of dequeued
	// after which each may go. Guarded by lateMu.
	late []latePacket

	// metrics counts the packets sent, under segment (to_agent or
	// to_client).
	metrics *metrics
	segment string
	// queued counts the DATA bytes in out and the packet being sent.
	queued queuedBytes
}

// latePacket is a packet of sendLate, due once dequeued reaches due.
type latePacket struct {
	pkt *client.Packet
	due uint64
}

// newPeer returns the peer of stream, whose sends m counts under segment.
func newPeer(stream packetStream, m *metrics, segment string) *peer {
	return &peer{stream: stream, out: make(chan *client.Packet, queueSize), done: make(chan struct{}), lateReady: make(chan struct{}, 1), metrics: m, segment: segment, queued: queuedBytes{m: m}}
}

// end marks the stream as ended for reason; the first reason wins.
func (p *peer) end(reason error) {
	p.once.Do(func() {
		p.reason = reason
		close(p.done)
		p.queued.stop()
	})
}

// send queues pkt, waiting for room until the stream ends or quit closes.
// It reports whether pkt was queued.
func (p *peer) send(pkt *client.Packet, quit <-chan struct{}) bool {
	select {
	case p.out <- pkt:
		p.queued.add(dataLen(pkt))
		return true
	default:
	}
	select {
	case p.out <- pkt:
		p.queued.add(dataLen(pkt))
		return true
	case <-p.done:
		return false
	case <-quit:
		return false
	}
}

// sendWithin is send with a limit on the wait: after d it gives up with
// errSlowFrontend.
func (p *peer) sendWithin(pkt *client.Packet, d time.Duration, quit <-chan struct{}) error {
	select {
	case p.out <- pkt:
		p.queued.add(dataLen(pkt))
		return nil
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case p.out <- pkt:
		p.queued.add(dataLen(pkt))
		return nil
	case <-p.done:
		return errPeerGone
	case <-quit:
		return errPeerGone
	case <-timer.C:
		return errSlowFrontend
	}
}

// sendLate queues pkt without waiting: it goes after every packet queued
// on out before the call, so it never overtakes them, but waits for no
// room. It is for the CLOSE_REQ of a frontend that has gone: the frontend
// cannot wait for an agent that does not read (its goroutines would stay
// for as long as the agent does), and there is at most one such packet
// per connection of the agent stream, so the list is bounded by them.
func (p *peer) sendLate(pkt *client.Packet) {
	// The packets ahead are the queued ones and at most one that
	// writeLoop has taken from out but not yet counted: reading len(out)
	// first and counting that one makes due late by at most one packet
	// (and by those dequeued between the two reads), never early. When
	// out runs empty first, nextLate lets the packet go anyway.
	queued := uint64(len(p.out))
	due := p.dequeued.Load() + queued + 1
	p.lateMu.Lock()
	p.late = append(p.late, latePacket{pkt: pkt, due: due})
	p.lateMu.Unlock()
	select {
	case p.lateReady <- struct{}{}:
	default: // writeLoop is woken already
	}
}

// nextLate removes and returns a packet of sendLate that is due, or nil.
// Only writeLoop calls it, between sends: an empty out then means that
// every packet queued before any late one has been sent.
func (p *peer) nextLate() *client.Packet {
	p.lateMu.Lock()
	defer p.lateMu.Unlock()
	n, drained := p.dequeued.Load(), len(p.out) == 0
	for i, lp := range p.late {
		if drained || lp.due <= n {
			p.late = append(p.late[:i:i], p.late[i+1:]...)
			return lp.pkt
		}
	}
	return nil
}

// writeLoop sends queued packets until the stream ends or a send fails.
func (p *peer) writeLoop() {
	for {
		pkt := p.nextLate()
		if pkt == nil {
			select {
			case <-p.done:
				return
			case pkt = <-p.out:
				p.dequeued.Add(1)
			case <-p.lateReady:
				// A late packet not yet due waits for out to drain to
				// it; each dequeue brings us back here.
				continue
			}
		}
		start := time.Now()
		err := p.stream.Send(pkt)
		p.queued.add(-dataLen(pkt))           // late packets carry no data: 0
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

// queuedBytes counts the bytes of one queue in the server's queued_bytes
// gauge. A byte is added once it is in the queue and subtracted once it
// has been sent; the two may come in either order (the writer can take a
// packet before its sender has counted it), so the count may dip below
// zero for a moment but adds up. stop takes what is left out of the gauge
// and counts nothing after it, so that data left in a queue whose stream
// has ended is not counted for ever.
type queuedBytes struct {
	m    *metrics
	mu   sync.Mutex
	n    int
	over bool
}

// add adds n (negative: subtracts) unless the queue is stopped.
func (q *queuedBytes) add(n int) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.over {
		return
	}
	q.n += n
	q.m.addQueuedBytes(n)
}

// stop takes the queue's bytes out of the gauge, for good.
func (q *queuedBytes) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.over {
		q.over = true
		q.m.addQueuedBytes(-q.n)
		q.n = 0
	}
}

// dataLen is the size of pkt's data: what it costs in a queue beyond a
// fixed size.
func dataLen(pkt *client.Packet) int { return len(pkt.GetData().GetData()) }
