package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/ondemand"
	"github.com/servercount/servercount/pkg/clock"
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

// maxControl bounds the control packets a stream queues that no tunnel of
// its own accounts for: answers to connections it does not hold, dial
// errors, heartbeats. A peer that reads its stream keeps them near empty
// whatever it sends; one that fills the bound has not read for as long as
// it took to answer maxControl distinct connections, and its stream is
// ended (errControlBacklog). A packet about one of the stream's tunnels
// or dials (sendTunnelControl) counts only against maxTunnelControl, far
// above the tunnels one stream holds (an agent of ours holds at most
// 5000 by default), so that closing every tunnel of a busy stream at once
// over a slow link does not end it; a packet outlives its tunnel in the
// queue, and a frontend that dials without reading could otherwise queue
// answers without end.
const (
	maxControl       = 4096
	maxTunnelControl = 1 << 16
)

var (
	// errControlBacklog ends a stream whose peer left maxControl control
	// packets unread.
	errControlBacklog = errors.New("peer did not read its control packets: too many queued")
	// errStalled ends an agent stream on which nothing moved for
	// Config.StreamStallTimeout while packets waited to be sent.
	errStalled = errors.New("nothing moved on the stream while packets waited")
	// errSilent ends an agent stream with heartbeats on from which
	// nothing arrived for wire.SilenceLimit of the agent's interval.
	errSilent = errors.New("the agent sent nothing, not even a heartbeat, for too long")
	// errReceiveStuck ends an agent stream whose receive loop was inside
	// one packet for Config.StreamStallTimeout.
	errReceiveStuck = errors.New("the stream's receive loop was stuck inside one packet")
	// errUnresponsive ends an agent stream whose agent answered no dial
	// for Config.StreamStallTimeout.
	errUnresponsive = errors.New("the agent answered no dial for too long")
)

// peer is one gRPC stream, agent or frontend, seen from the server. Its
// writer goroutine is the only caller of stream.Send, so sends are
// serialised without a lock held while sending. The writer runs only
// while something is queued: whoever queues starts it if none runs, and
// it ends once both queues are empty, so that an idle stream (most of a
// fleet's, most of the time) holds no goroutine and no stack for it.
//
// It has two queues, under one lock, mu, which also decides the order
// between them. The data queue carries packets that may wait for room: a
// frontend's DATA waits there for its agent (back-pressure). The control
// queue carries what a receive loop answers (CLOSE_REQ, CLOSE_RSP,
// DIAL_RSP errors): queueing there never waits, so that a receive loop
// never waits on its own peer's send path (see the package doc). A
// control packet goes after exactly the data packets queued before it:
// its place is the count of data packets put, read under the same lock
// as each put, so no packet can be in the queue without being counted
// (see queueControl).
type peer struct {
	stream packetStream
	done   chan struct{} // closed by end, once
	once   sync.Once
	reason error // why the stream ended; written in once before done closes, read after

	// room holds a token for each packet in the data queue and each
	// sender about to put one: a sender takes a token before it puts,
	// waiting while the queue is full, and the writer gives one back as
	// it takes a packet. It makes the wait for room a channel send, which
	// a sender can select on with its other ends, and wakes one waiter
	// per packet taken.
	room chan struct{}

	mu sync.Mutex
	// data is the data queue, a ring: n packets from head. room keeps n
	// at most queueSize. put counts the data packets ever queued and taken
	// those the writer has taken, so put - taken == n. Guarded by mu.
	data    [queueSize]*client.Packet
	head, n int
	put     uint64
	taken   uint64
	// control is the control queue, oldest first, each packet with the
	// value of put when it was queued: it goes once taken reaches it.
	// controlKeys holds a key per queued packet, so that a packet already
	// queued for the same connection is not queued twice. untied counts
	// the queued packets that no tunnel accounts for, which maxControl
	// bounds. Guarded by mu.
	control     []controlPacket
	controlKeys map[controlKey]struct{}
	untied      int
	// writer runs writeLoop while a queue holds a packet (after the
	// stream ends it counts as running for good); stopWriter ends it, and
	// writers counts the one that may still run.
	writer  ondemand.Loop
	writers sync.WaitGroup

	// mono reads the times below: nanoseconds of the monotonic clock, so
	// that a step of the wall clock neither ends a stream nor blinds a
	// check. 0 means not set.
	mono clock.Monotonic
	// moved is when a packet last moved on the stream, in or out: see
	// stalled.
	moved atomic.Int64
	// sent is when writeLoop last sent a packet, and received when the
	// receive loop last took one that shows the agent reads its stream:
	// anything but a plain HEARTBEAT, which an agent that reads nothing
	// can still send. An agent stream on which nothing was sent for the
	// heartbeat interval gets a HEARTBEAT, and a dial is unanswered while
	// nothing was received since.
	sent, received atomic.Int64
	// waiting is when the receive loop began to wait for the next
	// packet, 0 while it handles one; handling is when it began to
	// handle one, 0 while it waits. A peer is silent
	// only while the loop waits, and the loop is stuck only while it
	// handles: see liveness.checkStream.
	waiting, handling atomic.Int64
	// ended is set once done is closed, for the sweep to skip the stream
	// without touching the channel.
	ended atomic.Bool

	// metrics counts the packets sent, under segment (to_agent or
	// to_client).
	metrics *metrics
	segment string
	// queued counts the DATA bytes in the data queue and the packet being sent.
	queued queuedBytes
}

// controlPacket is a packet of the control queue, due once the writer
// has taken due data packets.
type controlPacket struct {
	pkt *client.Packet
	key controlKey
	due uint64
	// untied is set for a packet that no tunnel of the stream accounts
	// for; see maxControl.
	untied bool
}

// controlKey names what a control packet answers: its type and its
// connection ID (or dial random).
type controlKey struct {
	typ client.PacketType
	id  int64
}

// newPeer returns the peer of stream, whose sends m counts under segment,
// and whose times mono reads.
func newPeer(stream packetStream, m *metrics, segment string, mono clock.Monotonic) *peer {
	p := &peer{stream: stream, room: make(chan struct{}, queueSize), done: make(chan struct{}), metrics: m, segment: segment, queued: queuedBytes{m: m}, mono: mono}
	now := mono.Now()
	p.moved.Store(now)
	p.sent.Store(now)
	p.received.Store(now)
	return p
}

// end marks the stream as ended for reason; the first reason wins.
func (p *peer) end(reason error) {
	p.once.Do(func() {
		p.reason = reason
		p.ended.Store(true)
		close(p.done)
		p.queued.stop()
		p.mu.Lock()
		p.metrics.addControlQueued(-len(p.control))
		p.control, p.controlKeys, p.untied = nil, nil, 0
		p.mu.Unlock()
	})
}

// send queues pkt, waiting for room until the stream ends or quit or
// abort closes (errPeerGone) or, if d > 0, for at most d
// (errSlowFrontend). A receive loop never calls it on its own stream: it
// uses sendControl.
func (p *peer) send(pkt *client.Packet, d time.Duration, quit, abort <-chan struct{}) error {
	// Room now takes no timer.
	if p.offer(pkt) {
		return nil
	}
	if p.segment == segmentToClient {
		p.metrics.addWaitingForFrontend(1)
		defer p.metrics.addWaitingForFrontend(-1)
	}
	var timeout <-chan time.Time
	if d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case p.room <- struct{}{}:
		p.push(pkt)
		return nil
	case <-p.done:
		return errPeerGone
	case <-quit:
		return errPeerGone
	case <-abort:
		return errPeerGone
	case <-timeout:
		return errSlowFrontend
	}
}

// sendControl queues pkt, a packet without data that no tunnel of the
// stream accounts for (an answer to an unknown connection, a dial error,
// a heartbeat), on the control queue without waiting. It goes after every
// data packet queued before the call, so it never overtakes them (a
// CLOSE_REQ never overtakes the connection's last DATA), but it waits for
// no room. A packet with the same type and ID as one still queued is
// dropped: the queued one says the same. A peer that leaves maxControl
// such packets unread loses its stream (errControlBacklog); sendControl
// then reports false.
func (p *peer) sendControl(pkt *client.Packet, id int64) bool {
	return p.queueControl(pkt, id, true)
}

// sendTunnelControl is sendControl for a packet about a tunnel the stream
// holds or has just held (its CLOSE_REQ, DIAL_CLS or DIAL_REQ): the
// stream's tunnels bound these, not maxControl.
func (p *peer) sendTunnelControl(pkt *client.Packet, id int64) bool {
	return p.queueControl(pkt, id, false)
}

func (p *peer) queueControl(pkt *client.Packet, id int64, untied bool) bool {
	key := controlKey{pkt.GetType(), id}
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return false
	default:
	}
	if _, dup := p.controlKeys[key]; dup {
		p.mu.Unlock()
		return true
	}
	if untied && p.untied >= maxControl || len(p.control) >= maxControl+maxTunnelControl {
		p.mu.Unlock()
		p.metrics.observeStreamEnded(streamEndedControlBacklog)
		p.end(errControlBacklog)
		return false
	}
	if p.controlKeys == nil {
		p.controlKeys = map[controlKey]struct{}{}
	}
	p.controlKeys[key] = struct{}{}
	// Its place: after every data packet put so far, each counted under
	// this lock as it was put, and so after every packet of this tunnel
	// that its own goroutines queued before this call, whatever other
	// tunnels' senders do meanwhile.
	p.control = append(p.control, controlPacket{pkt: pkt, key: key, due: p.put, untied: untied})
	if untied {
		p.untied++
	}
	p.mu.Unlock()
	p.startWriter()
	p.metrics.addControlQueued(1)
	return true
}

// recv returns the next packet of the stream, counted under segment from.
// A failed receive is counted, but for EOF (the peer's clean end), and
// ends the stream. It records when the receive loop waits and when it
// handles a packet (waiting, handling), until the next recv.
func (p *peer) recv(from string) (*client.Packet, error) {
	p.handling.Store(0)
	p.waiting.Store(p.mono.Now())
	pkt, err := p.stream.Recv()
	p.waiting.Store(0)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			p.metrics.streamError(from, err, wire.PacketTypeNone)
		}
		p.end(err)
		return nil, err
	}
	p.metrics.packet(from, pkt.GetType())
	return pkt, nil
}

// arrived records that pkt arrived on an agent stream, and that the
// receive loop handles it from now.
func (p *peer) arrived(pkt *client.Packet) {
	now := p.mono.Now()
	p.moved.Store(now)
	if _, progress := wire.DialProgressOf(pkt); progress || pkt.GetType() != wire.PacketHeartbeat {
		p.received.Store(now)
	}
	p.handling.Store(now)
}

// idle reports how long the receive loop has waited for a packet at now
// (a reading of mono), 0 while it handles one.
func (p *peer) idle(now int64) time.Duration { return since(now, p.waiting.Load()) }

// busy reports how long the receive loop has been handling one packet at
// now, 0 while it waits.
func (p *peer) busy(now int64) time.Duration { return since(now, p.handling.Load()) }

// since is now minus t, two readings of the same clock.Monotonic; 0 when
// t is 0 (not set).
func since(now, t int64) time.Duration {
	if t == 0 {
		return 0
	}
	return time.Duration(now - t)
}

// stalled reports whether packets have waited to be sent while nothing
// moved on the stream, in or out, for d: the stream is stuck, whatever
// the cause, and only ending it frees what waits on it. Packets wait
// while the writer runs (and once the stream has ended, when nobody
// asks), and moved is reset when one starts, so that packets queued on a
// stream long idle are given d from then.
func (p *peer) stalled(now int64, d time.Duration) bool {
	// Running first: see startWriter.
	return p.writer.Running() && since(now, p.moved.Load()) >= d
}

// queuedBytes counts the bytes of one queue in the server's queued_bytes
// gauge. A byte is added once it is in the queue and subtracted once it
// has been sent; where the queue is a channel the two may come in either
// order (the writer can take a packet before its sender has counted it),
// so the count may dip below zero for a moment but adds up. stop takes
// what is left out of the gauge and counts nothing after it, so that
// data left in a queue whose stream has ended is not counted for ever.
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

// wait blocks the gRPC handler until p ends, its client goes away or quit
// closes (the Server closes), and returns the handler's status. Returning
// cancels the stream's context, which ends p's receive loop and writer
// even when they are blocked in Recv or Send: that is why neither runs on
// the handler's goroutine. The client's going away is watched here, not
// only through Recv, because the receive loop may be waiting for room in
// an agent's queue instead of receiving. An agent stream's liveness is
// the sweep's (sweep.go), which ends p when it is stuck or its agent dead.
func (p *peer) wait(quit <-chan struct{}) error {
	select {
	case <-p.done:
	case <-p.stream.Context().Done():
		p.end(p.stream.Context().Err())
	case <-quit:
		p.end(errShuttingDown)
	}
	switch err := p.reason; {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, errShuttingDown):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errSlowFrontend), errors.Is(err, errControlBacklog):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errStalled), errors.Is(err, errSilent), errors.Is(err, errReceiveStuck), errors.Is(err, errUnresponsive):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.Unknown, err.Error())
	}
}
