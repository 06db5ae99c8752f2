package churn

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"
)

// The integrity check: every tunnel carries a known stream each way, and
// both ends check what arrived, byte for byte. A tunnel must deliver
// every byte or report an error (a failed dial, a reset, a failed write);
// a clean end of stream after fewer or other bytes is a silent loss, the
// worst bug a proxy can have.

// Case is what a tunnel does, from the client's side.
type Case uint8

// The cases. Up is the client's bytes to the target, Down the target's to
// the client.
const (
	// UpClose: the client writes Up bytes and closes.
	UpClose Case = iota + 1
	// UpHalfClose: the client writes Up bytes, half-closes (CloseWrite;
	// a frontend without one closes), and reads to the end.
	UpHalfClose
	// DownFIN: the target writes Down bytes and half-closes (FIN); the
	// client reads to the end, then closes.
	DownFIN
	// DownSlow is DownFIN with a client that reads slowly, 4 KiB every
	// millisecond, while the target has long finished and closed.
	DownSlow
	// Request: the client writes Up bytes, the target reads them all,
	// then writes Down bytes and half-closes; the client reads to the
	// end. kube-apiserver's requests are of this form.
	Request
	// Burst is DownFIN for a group of tunnels whose targets all write
	// and close at the same instant, once every tunnel of the group has
	// sent its header.
	Burst
)

func (c Case) String() string {
	switch c {
	case UpClose:
		return "up-close"
	case UpHalfClose:
		return "up-half-close"
	case DownFIN:
		return "down-fin"
	case DownSlow:
		return "down-slow"
	case Request:
		return "request"
	case Burst:
		return "burst"
	}
	return fmt.Sprintf("case-%d", uint8(c))
}

// Tunnel is one tunnel of an integrity run.
type Tunnel struct {
	// ID names the tunnel at the target, and seeds its streams.
	ID uint64
	Case
	// Up and Down are the bytes each way.
	Up, Down int64
	// Group is the size of the tunnel's Burst group (Burst only).
	Group int
}

// headerLen is the size of the header the client sends first: ID, Up,
// Down, then the case and the group size.
const headerLen = 32

func (tn Tunnel) header() []byte {
	b := binary.BigEndian.AppendUint64(nil, tn.ID)
	b = binary.BigEndian.AppendUint64(b, uint64(tn.Up))
	b = binary.BigEndian.AppendUint64(b, uint64(tn.Down))
	return binary.BigEndian.AppendUint64(b, uint64(tn.Case)|uint64(tn.Group)<<8)
}

func parseHeader(b []byte) Tunnel {
	flags := binary.BigEndian.Uint64(b[24:])
	return Tunnel{ID: binary.BigEndian.Uint64(b), Up: int64(binary.BigEndian.Uint64(b[8:])), Down: int64(binary.BigEndian.Uint64(b[16:])),
		Case: Case(flags & 0xff), Group: int(flags >> 8)}
}

// Seeds of the two directions: a byte of one tunnel's stream at another
// tunnel's offset, or of the other direction, differs mostly.
func upSeed(id uint64) uint64   { return id * 2 }
func downSeed(id uint64) uint64 { return id*2 + 1 }

// stream is the deterministic stream of seed: the byte at offset i is
// (i + seed*37) mod 251.
func streamByte(seed uint64, i int64) byte { return byte((uint64(i) + seed*37) % 251) }

// Received is what one end read of one direction.
type Received struct {
	// Bytes is how many arrived, and Sum their SHA-256.
	Bytes int64
	Sum   [32]byte
	// Bad is the offset of the first byte that differs from the stream
	// sent, -1 if none.
	Bad int64
	// Err is how the stream ended: nil for a clean end (EOF, or all of a
	// stream of known length), else the error (a reset, a timeout).
	Err error
}

// checker reads a stream of seed and checks each byte as it comes.
type checker struct {
	seed uint64
	n    int64
	bad  int64
	h    hash.Hash
}

func newChecker(seed uint64) *checker { return &checker{seed: seed, bad: -1, h: sha256.New()} }

func (c *checker) Write(p []byte) (int, error) {
	if c.bad < 0 {
		for i, b := range p {
			if b != streamByte(c.seed, c.n+int64(i)) {
				c.bad = c.n + int64(i)
				break
			}
		}
	}
	c.n += int64(len(p))
	c.h.Write(p)
	return len(p), nil
}

func (c *checker) received(err error) Received {
	r := Received{Bytes: c.n, Bad: c.bad, Err: err}
	c.h.Sum(r.Sum[:0])
	return r
}

// writeStream writes n bytes of seed's stream to w, in pieces of at most
// 64 KiB, and returns the SHA-256 of what it wrote.
func writeStream(w io.Writer, seed uint64, n int64) ([32]byte, error) {
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for off := int64(0); off < n; {
		k := min(int64(len(buf)), n-off)
		for i := range k {
			buf[i] = streamByte(seed, off+i)
		}
		h.Write(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return [32]byte{}, err
		}
		off += k
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// sumOf is the SHA-256 of the first n bytes of seed's stream.
func sumOf(seed uint64, n int64) [32]byte {
	s, _ := writeStream(io.Discard, seed, n)
	return s
}

// IntegrityTarget is the far end of integrity runs: a TCP server on
// 127.0.0.1 that reads each tunnel's header, then does its part of the
// case and records what it read.
type IntegrityTarget struct {
	Addr string

	// started counts the tunnels whose header arrived.
	started atomic.Int64

	mu      sync.Mutex
	got     map[uint64]Received      // guarded by mu
	waiters map[uint64]chan struct{} // closed when got has the ID; guarded by mu
	groups  map[int]*burstGroup      // by group size; guarded by mu
}

// burstGroup holds a Burst group's targets until all have arrived.
type burstGroup struct {
	arrived int
	release chan struct{}
}

// StartIntegrityTarget starts the target; it stops, every connection
// closed, when tb ends.
func StartIntegrityTarget(tb testing.TB) *IntegrityTarget {
	tb.Helper()
	it := &IntegrityTarget{got: map[uint64]Received{}, waiters: map[uint64]chan struct{}{}, groups: map[int]*burstGroup{}}
	it.Addr = nettest.Serve(tb, it.serve)
	return it
}

func (it *IntegrityTarget) serve(c net.Conn) {
	hdr := make([]byte, headerLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return // no tunnel of a run: a dial that failed, or a probe
	}
	tn := parseHeader(hdr)
	it.started.Add(1)
	up := newChecker(upSeed(tn.ID))
	switch tn.Case {
	case Request:
		// All of Up first: the request, then the answer.
		_, err := io.CopyN(up, c, tn.Up)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil // a clean end, short: the record says so
			}
			it.record(tn.ID, up.received(err))
			return
		}
		if _, err := writeStream(c, downSeed(tn.ID), tn.Down); err == nil {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	case DownFIN, DownSlow, Burst:
		if tn.Case == Burst {
			<-it.arrive(tn.Group)
		}
		if _, err := writeStream(c, downSeed(tn.ID), tn.Down); err == nil {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	}
	_, err := io.Copy(up, c)
	it.record(tn.ID, up.received(err))
}

// Started is how many tunnels' headers have reached the target.
func (it *IntegrityTarget) Started() int { return int(it.started.Load()) }

// arrive counts a Burst tunnel of a group of size n in, and returns the
// channel that is closed once the whole group is.
func (it *IntegrityTarget) arrive(n int) <-chan struct{} {
	it.mu.Lock()
	defer it.mu.Unlock()
	g := it.groups[n]
	if g == nil {
		g = &burstGroup{release: make(chan struct{})}
		it.groups[n] = g
	}
	g.arrived++
	if g.arrived == n {
		close(g.release)
		delete(it.groups, n) // the next group of this size starts anew
	}
	return g.release
}

func (it *IntegrityTarget) record(id uint64, r Received) {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.got[id] = r
	if w := it.waiters[id]; w != nil {
		close(w)
		delete(it.waiters, id)
	}
}

// received waits until the target has recorded tunnel id, or ctx ends.
func (it *IntegrityTarget) received(ctx context.Context, id uint64) (Received, bool) {
	it.mu.Lock()
	if r, ok := it.got[id]; ok {
		delete(it.got, id)
		it.mu.Unlock()
		return r, true
	}
	w := it.waiters[id]
	if w == nil {
		w = make(chan struct{})
		it.waiters[id] = w
	}
	it.mu.Unlock()
	select {
	case <-w:
	case <-ctx.Done():
		return Received{}, false
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	r := it.got[id]
	delete(it.got, id)
	return r, true
}

// Verdict is what became of one tunnel.
type Verdict uint8

// The verdicts.
const (
	// Delivered: every byte, both ways, and clean ends.
	Delivered Verdict = iota
	// Failed: fewer bytes, but an end saw the failure: the dial failed,
	// or a read or write failed.
	Failed
	// Silent: an end saw a clean end of stream after fewer or other
	// bytes than were sent.
	Silent
)

func (v Verdict) String() string {
	return [...]string{"delivered", "failed", "silent"}[v]
}

// Outcome is one tunnel's result.
type Outcome struct {
	Tunnel
	Verdict
	// Up is what the target read, Down what the client read (Down.Bytes
	// 0 for the cases that do not read).
	Up, Down Received
	// Err is the failure the client saw, nil if none.
	Err error
}

func (o Outcome) String() string {
	s := fmt.Sprintf("tunnel %d (%s, up %d, down %d): %s; target read %d bytes (first bad %d, end %v)",
		o.ID, o.Case, o.Tunnel.Up, o.Tunnel.Down, o.Verdict, o.Up.Bytes, o.Up.Bad, o.Up.Err)
	if o.Tunnel.Down > 0 {
		s += fmt.Sprintf("; client read %d (first bad %d, end %v)", o.Down.Bytes, o.Down.Bad, o.Down.Err)
	}
	if o.Err != nil {
		s += fmt.Sprintf("; client error: %v", o.Err)
	}
	return s
}

// failedRecordWait is how long a run waits for the target's record of a
// tunnel whose client saw it fail, which may have failed before its
// header reached the target: then the target records nothing.
const failedRecordWait = 5 * time.Second

// RunIntegrity runs tunnels through dial to target, at most concurrent at
// once (Burst groups must fit in it), and returns each tunnel's outcome
// in order. recordWait bounds the wait for the target's record of a
// tunnel whose client is done: a tunnel whose far end does not learn
// within it that the tunnel ended failed without the client seeing it,
// and is silent. (An agent that drops the DATA of a tunnel it is asked
// to close drops its header too, when it is all there is: the target
// then never learns which tunnel it was.)
func RunIntegrity(ctx context.Context, dial Dialer, target *IntegrityTarget, tunnels []Tunnel, concurrent int, recordWait time.Duration) []Outcome {
	out := make([]Outcome, len(tunnels))
	sem := make(chan struct{}, concurrent)
	var wg sync.WaitGroup
	for i, tn := range tunnels {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i] = runTunnel(ctx, dial, target, tn, recordWait)
		})
	}
	wg.Wait()
	return out
}

func runTunnel(ctx context.Context, dial Dialer, target *IntegrityTarget, tn Tunnel, recordWait time.Duration) Outcome {
	o := Outcome{Tunnel: tn}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends a konnectivity-client connection whatever it waits on
	c, err := dial(tctx, target.Addr)
	if err != nil {
		o.Verdict, o.Err = Failed, err
		return o
	}
	o.Down, o.Err = clientPart(c, tn)
	_ = c.Close()
	// A client that failed may have failed before its header reached the
	// target, which then records nothing: it waits less.
	wait := recordWait
	if o.Err != nil {
		wait = failedRecordWait
	}
	rctx, rcancel := context.WithTimeout(ctx, wait)
	defer rcancel()
	r, ok := target.received(rctx, tn.ID)
	if !ok {
		r = Received{Bad: -1, Err: fmt.Errorf("no record from the target within %v", wait)}
	}
	o.Up = r
	o.Verdict = judge(tn, o.Up, o.Down, o.Err, ok)
	return o
}

// clientPart does the client's part of tn's case on c, after the header,
// and returns what it read of the target's stream.
func clientPart(c net.Conn, tn Tunnel) (Received, error) {
	if _, err := c.Write(tn.header()); err != nil {
		return Received{Bad: -1}, fmt.Errorf("write the header: %w", err)
	}
	if tn.Up > 0 {
		if _, err := writeStream(c, upSeed(tn.ID), tn.Up); err != nil {
			return Received{Bad: -1}, fmt.Errorf("write: %w", err)
		}
	}
	switch tn.Case {
	case UpClose:
		return Received{Bad: -1}, nil
	case UpHalfClose:
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			if err := cw.CloseWrite(); err != nil {
				return Received{Bad: -1}, fmt.Errorf("half-close: %w", err)
			}
		} else {
			return Received{Bad: -1}, nil // no half-close: closed by the caller
		}
	}
	down := newChecker(downSeed(tn.ID))
	var err error
	if tn.Case == DownSlow {
		err = readSlowly(c, down)
	} else {
		_, err = io.Copy(down, c)
	}
	return down.received(err), nil
}

// readSlowly copies c to w 4 KiB a millisecond, until the end.
func readSlowly(c net.Conn, w io.Writer) error {
	buf := make([]byte, 4<<10)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		n, err := c.Read(buf)
		_, _ = w.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// judge gives a tunnel's verdict from what each end read.
func judge(tn Tunnel, up, down Received, clientErr error, recorded bool) Verdict {
	wantDown := int64(0)
	switch tn.Case {
	case DownFIN, DownSlow, Request, Burst:
		wantDown = tn.Down
	}
	upOK := up.Err == nil && up.Bytes == tn.Up && up.Bad < 0 && up.Sum == sumOf(upSeed(tn.ID), tn.Up)
	downOK := down.Err == nil && down.Bytes == wantDown && down.Bad < 0 && (wantDown == 0 || down.Sum == sumOf(downSeed(tn.ID), wantDown))
	switch {
	case upOK && downOK && clientErr == nil:
		return Delivered
	case !recorded && clientErr == nil:
		return Silent // the target never learned that the tunnel ended
	case up.Err == nil && !upOK, down.Err == nil && !downOK && clientErr == nil:
		return Silent
	}
	return Failed
}

// Tally counts outcomes by verdict.
type Tally struct{ Tunnels, Delivered, Failed, Silent int }

// Count tallies outcomes.
func Count(outcomes []Outcome) Tally {
	var t Tally
	for _, o := range outcomes {
		t.Tunnels++
		switch o.Verdict {
		case Delivered:
			t.Delivered++
		case Failed:
			t.Failed++
		case Silent:
			t.Silent++
		}
	}
	return t
}

func (t Tally) String() string {
	return fmt.Sprintf("%d tunnels: %d delivered, %d failed, %d silent", t.Tunnels, t.Delivered, t.Failed, t.Silent)
}

// IntegrityTunnels returns the tunnels of a run, at least n: every case
// at the sizes around 0, 1, 32 KiB (one packet), 1 MiB, and 16 MiB in
// the first round only, slow reads up to 1 MiB, and a Burst group of 64
// of up to 32 KiB each, repeated until there are n, with IDs from first.
func IntegrityTunnels(first uint64, n int) [][]Tunnel {
	small := []int64{0, 1, 32<<10 - 1, 32 << 10, 32<<10 + 1}
	large := []int64{1<<20 - 1, 1 << 20, 1<<20 + 1}
	id := first
	next := func() uint64 { id++; return id }
	var rounds [][]Tunnel
	for total := 0; total < n; {
		var plain []Tunnel
		sizes := append(append([]int64{}, small...), large...)
		if len(rounds) == 0 {
			sizes = append(sizes, 16<<20)
		}
		for _, s := range sizes {
			plain = append(plain,
				Tunnel{ID: next(), Case: UpClose, Up: s},
				Tunnel{ID: next(), Case: UpHalfClose, Up: s},
				Tunnel{ID: next(), Case: DownFIN, Down: s},
				Tunnel{ID: next(), Case: Request, Up: s, Down: s})
			if s <= 1<<20+1 {
				plain = append(plain, Tunnel{ID: next(), Case: DownSlow, Down: s})
			}
		}
		var burst []Tunnel
		for i := range 64 {
			burst = append(burst, Tunnel{ID: next(), Case: Burst, Down: small[i%len(small)], Group: 64})
		}
		rounds = append(rounds, plain, burst)
		total += len(plain) + len(burst)
	}
	return rounds
}
