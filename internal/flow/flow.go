// Package flow is the per-tunnel flow control that servercount's agent
// and server use between themselves. Upstream's protocol has none: every
// tunnel of an agent stream shares the stream, so a receiver whose writer
// cannot keep up (a frontend or an endpoint that does not read) must make
// the stream's receive loop wait, stalling every other tunnel on it.
//
// With flow control each end grants the other a window of bytes per tunnel
// and direction. A sender takes credit from its [Window] before it sends
// DATA and gets it back in WINDOW packets (wire.WindowUpdate); the
// receiver queues what arrives in a [Queue] that can always hold it, so
// its receive loop never waits for a writer. A tunnel whose reader stops
// then costs only itself: its sender waits for credit, and its writer's
// own timeout ends it.
//
// It is used only when both ends announce it in the Connect handshake
// (wire.HeaderTunnelWindow); with an upstream peer nothing changes.
package flow

import (
	"errors"
	"sync"

	"github.com/servercount/servercount/pkg/wire"
)

// Window is a sender's credit for one tunnel and direction: how many more
// bytes the receiver has room for. It is safe for concurrent use.
type Window struct {
	mu     sync.Mutex
	n      int
	closed bool
	// ready has a buffer of 1: a Take that found no credit waits on it.
	ready chan struct{}
}

// NewWindow returns a Window with n bytes of credit, the receiver's
// announced window.
func NewWindow(n int) *Window {
	return &Window{n: min(n, wire.MaxTunnelWindow), ready: make(chan struct{}, 1)}
}

// Take waits until there is credit and takes up to max bytes of it. It
// returns 0 when the window is closed or done closes first.
func (w *Window) Take(max int, done <-chan struct{}) int {
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return 0
		}
		if w.n > 0 {
			k := min(w.n, max)
			w.n -= k
			w.mu.Unlock()
			return k
		}
		w.mu.Unlock()
		select {
		case <-w.ready:
		case <-done:
			return 0
		}
	}
}

// TryTake takes up to max bytes of credit without waiting. It returns 0
// when there is none; open is false once the window is closed. A caller
// that must wait with other cases of its own waits on Ready, then tries
// again.
func (w *Window) TryTake(max int) (n int, open bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, false
	}
	n = min(w.n, max)
	w.n -= n
	return n, true
}

// Ready returns a channel that receives when credit has come or the
// window has closed since a TryTake found none.
func (w *Window) Ready() <-chan struct{} { return w.ready }

// Give adds n bytes of credit: the receiver wrote them, or a Take took
// more than was sent. n <= 0 is ignored.
func (w *Window) Give(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	// Credit beyond the largest window is not kept, so that a peer's
	// grants cannot overflow.
	w.n = min(w.n+min(n, wire.MaxTunnelWindow), wire.MaxTunnelWindow)
	w.mu.Unlock()
	signal(w.ready)
}

// Close ends the window: a waiting Take and every later one return 0.
func (w *Window) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	signal(w.ready)
}

// ErrWindowExceeded is returned by Queue.Put when the sender sent more
// than its window: it does not follow the protocol, and the tunnel should
// be closed.
var ErrWindowExceeded = errors.New("peer sent more data than its tunnel window allows")

// ErrClosed is returned by Queue.Put after CloseWrite or Close.
var ErrClosed = errors.New("tunnel queue is closed")

// keepSize is the size from which Put keeps the caller's slice rather than
// copying it: a large packet's data goes to the writer without a copy.
// Smaller pieces are copied and coalesced, so that their number, and what
// each costs beyond its bytes, stays bounded.
const keepSize = 4 << 10

// smallCap bounds a segment of coalesced small pieces, and smallMin is the
// least it is allocated with. A segment's capacity is at most twice its
// bytes or smallMin, and small segments are separated by kept ones (of
// keepSize or more) or full: whatever the pattern of packet sizes, a
// queue holds little more than twice its window.
const (
	smallCap = 32 << 10
	smallMin = 512
)

// segment is a run of queued bytes: a slice kept from Put, or small
// pieces copied together.
type segment struct {
	b    []byte
	kept bool
}

// Queue holds the bytes a receiver has taken for one tunnel and not yet
// written: at most its window, however small the packets they came in.
// Large pieces are kept as they are and handed to the writer without a
// copy; small ones are copied together, which coalesces them into fewer
// writes. It is safe for one goroutine calling Put and one calling Next
// at a time.
type Queue struct {
	mu sync.Mutex
	// segs are the queued bytes, segs[0].b[head:] first; n counts them.
	segs []segment
	head int
	n    int
	// held counts bytes taken by Next and not yet Released; unacked
	// counts released bytes not yet granted back to the sender. With the
	// queued ones they make what the sender may not exceed.
	held, unacked int
	window        int
	// batch is how many released bytes make a grant: a quarter of the
	// window with flow control, 1 (at once) without.
	batch int
	// writeClosed: no more Put; Next drains and then reports the end.
	// closed: the tunnel is over, Next returns at once.
	writeClosed, closed bool
	// ready has a buffer of 1: a Next that found nothing waits on it.
	ready chan struct{}
	// room has a buffer of 1: signalled when a grant frees room.
	room chan struct{}
}

// NewQueue returns a Queue for a tunnel whose flow-control window is
// window bytes: room is freed, and credit granted, in batches of a
// quarter of it.
func NewQueue(window int) *Queue {
	return &Queue{window: window, batch: max(window/4, 1), ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// NewBoundedQueue returns a Queue that holds at most limit bytes, for a
// peer without flow control: a receiver that finds it full waits for
// Room, and every byte written frees its room at once.
func NewBoundedQueue(limit int) *Queue {
	return &Queue{window: limit, batch: 1, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// Put queues b. It fails with ErrWindowExceeded when b would take the
// queue past the window, and with ErrClosed once the queue is closed; it
// never waits. A b of keepSize bytes or more is kept, not copied: the
// caller must not change it afterwards.
func (q *Queue) Put(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	q.mu.Lock()
	switch {
	case q.closed || q.writeClosed:
		q.mu.Unlock()
		return ErrClosed
	case q.n+q.held+q.unacked+len(b) > q.window:
		q.mu.Unlock()
		return ErrWindowExceeded
	}
	q.n += len(b)
	last := len(q.segs) - 1
	switch {
	case len(b) >= keepSize:
		q.segs = append(q.segs, segment{b: b, kept: true})
	case last >= 0 && !q.segs[last].kept && len(q.segs[last].b)+len(b) <= smallCap:
		q.segs[last].b = append(q.segs[last].b, b...)
	default:
		q.segs = append(q.segs, segment{b: append(make([]byte, 0, max(len(b), smallMin)), b...)})
	}
	q.mu.Unlock()
	signal(q.ready)
	return nil
}

// Room returns a channel that receives when a grant has made room: a
// receiver that waits for room instead of failing (a peer without flow
// control) retries Put then.
func (q *Queue) Room() <-chan struct{} { return q.room }

// Next waits for queued bytes and returns up to max of them. A kept
// piece that fits is returned as it is; otherwise the bytes are copied
// into a new slice. They count against the window until they are
// Released. It returns nil, false when the queue is closed, or
// write-closed and empty, or when done closes.
func (q *Queue) Next(max int, done <-chan struct{}) ([]byte, bool) {
	for {
		p, more := q.TryNext(max)
		if p != nil || !more {
			return p, p != nil
		}
		select {
		case <-q.ready:
		case <-done:
			return nil, false
		}
	}
}

// TryNext is Next without the wait: with nothing queued it returns nil,
// and more reports whether bytes may still come (false once the queue is
// closed, or write-closed and empty). A writer that runs only while
// there is something to write stops on nil.
func (q *Queue) TryNext(max int) (p []byte, more bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false
	}
	if q.n == 0 {
		return nil, !q.writeClosed
	}
	if first := q.segs[0]; first.kept && q.head == 0 && len(first.b) <= max {
		p = first.b
		q.popSegment()
	} else {
		p = make([]byte, min(max, q.n))
		for got := 0; got < len(p); {
			k := copy(p[got:], q.segs[0].b[q.head:])
			got += k
			q.head += k
			if q.head == len(q.segs[0].b) {
				q.popSegment()
			}
		}
	}
	q.n -= len(p)
	q.held += len(p)
	return p, true
}

// popSegment drops the first segment. Called with mu held.
func (q *Queue) popSegment() {
	q.segs[0] = segment{}
	q.segs = q.segs[1:]
	q.head = 0
	if len(q.segs) == 0 {
		q.segs = nil
	}
}

// Release records that n bytes returned by Next were written, and returns
// the credit to grant the sender now, if any. With flow control credit is
// granted in batches of a quarter of the window, so that a sender always
// has at least three quarters of it to send and a WINDOW packet costs
// little.
func (q *Queue) Release(n int) int {
	q.mu.Lock()
	q.held -= n
	q.unacked += n
	if q.unacked < q.batch {
		q.mu.Unlock()
		return 0
	}
	grant := q.unacked
	q.unacked = 0
	q.mu.Unlock()
	signal(q.room)
	return grant
}

// CloseWrite ends the queue after what is queued: Put fails, and Next
// reports the end once the queue is empty.
func (q *Queue) CloseWrite() {
	q.mu.Lock()
	q.writeClosed = true
	q.mu.Unlock()
	signal(q.ready)
}

// Close ends the queue now and drops what it holds; it returns the number
// of queued bytes dropped.
func (q *Queue) Close() int {
	q.mu.Lock()
	dropped := q.n
	q.closed = true
	for len(q.segs) > 0 {
		q.popSegment()
	}
	q.n = 0
	q.mu.Unlock()
	signal(q.ready)
	signal(q.room)
	return dropped
}

// signal wakes the waiter on c, a channel with a buffer of 1.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // a wake-up is pending already
	}
}
