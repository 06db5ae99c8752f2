package server

import (
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// queueSize is the number of packets a stream's send queue holds. Packets
// carry up to 32 KiB of data each, so a full queue is about 1 MiB.
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
}

func newPeer(stream packetStream) *peer {
	return &peer{stream: stream, out: make(chan *client.Packet, queueSize), done: make(chan struct{})}
}

// end marks the stream as ended for reason; the first reason wins.
func (p *peer) end(reason error) {
	p.once.Do(func() {
		p.reason = reason
		close(p.done)
	})
}

// send queues pkt, waiting for room until the stream ends or quit closes.
// It reports whether pkt was queued.
func (p *peer) send(pkt *client.Packet, quit <-chan struct{}) bool {
	select {
	case p.out <- pkt:
		return true
	default:
	}
	select {
	case p.out <- pkt:
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
		return nil
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case p.out <- pkt:
		return nil
	case <-p.done:
		return errPeerGone
	case <-quit:
		return errPeerGone
	case <-timer.C:
		return errSlowFrontend
	}
}

// writeLoop sends queued packets until the stream ends or a send fails.
func (p *peer) writeLoop() {
	for {
		select {
		case <-p.done:
			return
		case pkt := <-p.out:
			if err := p.stream.Send(pkt); err != nil {
				p.end(err)
				return
			}
		}
	}
}
