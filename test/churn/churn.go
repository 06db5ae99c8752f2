// Package churn drives the traffic under which an agent stream once locked
// up for good: long uploads and downloads beside a stream of
// short tunnels that are closed from both ends while data is still moving,
// some of them read slowly. It watches that the stream keeps making
// progress: a new tunnel must get its first byte at any moment, and every
// short tunnel must finish or fail with an error within a bound.
//
// The workload only dials; the proxy under test is whatever the Dialer
// goes through: servers and agents in the test process, or the binaries
// as processes, ours or upstream's.
package churn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Dialer opens a connection to addr through the proxy under test. The
// connection may end when ctx does, and should: Run cancels ctx once it
// is done with the connection, and that is the only way to end a
// konnectivity-client connection whose Write waits for gRPC flow control
// (its Close does not interrupt it).
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// Config is one churn run. Zero fields take the defaults below.
type Config struct {
	// Dial opens every tunnel of the run. Required.
	Dial Dialer
	// Targets are the endpoints the tunnels reach. Required.
	Targets Targets
	// Duration is how long the workload runs; default 10 s.
	Duration time.Duration
	// Uploads and Downloads are the long transfers that run for the whole
	// Duration; default 10 each, and -1 for none. Every third download
	// reads slowly (4 KiB every 5 ms) unless Gentle.
	Uploads, Downloads int
	// Workers open and close short tunnels, one at a time each; default 8,
	// and -1 for none.
	// Even workers close their tunnels from the frontend while the target
	// still sends, odd ones have the target close while the frontend
	// still sends.
	Workers int
	// Stall is how long the run tolerates no progress: a probe tunnel
	// that gets no echo, or a short tunnel that neither finishes nor
	// fails, within Stall is a lock-up. Default 15 s: far beyond what any
	// healthy tunnel takes on a loaded machine, far below forever.
	Stall time.Duration
	// ProbeInterval separates probe tunnels; default 500 ms.
	ProbeInterval time.Duration
	// Gentle leaves the slow readers out. Without flow control (upstream's
	// protocol, a window of -1) one slow reader holds up every tunnel of
	// its agent stream for as long as it keeps its queue full: upstream's
	// own server and agent starve new tunnels for more than Stall with
	// them. Runs with an upstream half are gentle, so that they test our
	// half, not the protocol.
	Gentle bool
}

// Defaults of Config.
const (
	DefaultDuration      = 10 * time.Second
	DefaultUploads       = 10
	DefaultDownloads     = 10
	DefaultWorkers       = 8
	DefaultStall         = 15 * time.Second
	DefaultProbeInterval = 500 * time.Millisecond
)

// Result is what a run did.
type Result struct {
	// Tunnels is the number of short tunnels that finished, and Failed
	// the number that failed with an error (a refused dial included):
	// Tunnels+Failed were tried, and the failed share is
	// Failed/(Tunnels+Failed).
	Tunnels, Failed int64
	// FrontendCloses and EndpointCloses split Tunnels and Failed by the
	// kind of short tunnel: closed by the frontend while the source still
	// sends, or by the closer while the frontend still writes.
	FrontendCloses, EndpointCloses ShortCount
	// Probes is the number of probe round trips that succeeded.
	Probes int64
	// Uploaded and Downloaded are the bytes the long transfers moved.
	Uploaded, Downloaded int64
	// SlowestProbe is the longest a successful probe took to get its
	// echo.
	SlowestProbe time.Duration
	// FirstError is the first error of a short tunnel, for the log.
	FirstError error
	// Errors counts the failed short tunnels by the kind of their error:
	// what the worker was doing, and the error's last words.
	Errors map[string]int64
}

// ShortCount is how many short tunnels of one kind finished and how many
// failed.
type ShortCount struct{ Finished, Failed int64 }

// Share is the failed share of the tunnels tried, in percent; 0 for none.
func (c ShortCount) Share() float64 {
	if c.Finished+c.Failed == 0 {
		return 0
	}
	return 100 * float64(c.Failed) / float64(c.Finished+c.Failed)
}

// String says how many failed of how many tried, and the share.
func (c ShortCount) String() string {
	return fmt.Sprintf("%d of %d failed (%.1f %%)", c.Failed, c.Finished+c.Failed, c.Share())
}

func (r Result) String() string {
	return fmt.Sprintf("%d short tunnels (%d failed), %d probes (slowest %v), %d MB up, %d MB down",
		r.Tunnels, r.Failed, r.Probes, r.SlowestProbe.Round(time.Millisecond), r.Uploaded>>20, r.Downloaded>>20)
}

// ErrLockedUp is wrapped by Run's error when the proxy stopped making
// progress.
var ErrLockedUp = errors.New("the proxy stopped making progress")

// run is the state of one Run.
type run struct {
	cfg Config

	probes atomic.Int64
	// byKind counts finished [0] and failed [1] short tunnels, frontend
	// closes first.
	byKind   [2][2]atomic.Int64
	up, down atomic.Int64
	slowest  atomic.Int64 // nanoseconds

	mu       sync.Mutex
	firstErr error            // guarded by mu
	errs     map[string]int64 // guarded by mu
	lockErr  error            // guarded by mu
	locked   chan struct{}
}

// Run runs the workload for cfg.Duration, or until ctx ends, and returns
// what it did. The error wraps ErrLockedUp when a probe or a short tunnel
// made no progress within cfg.Stall; it is nil otherwise, whatever single
// tunnels failed with. Every goroutine and connection of the run is gone
// when Run returns.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Dial == nil || cfg.Targets.Sink == "" {
		return Result{}, errors.New("churn: Config needs Dial and Targets")
	}
	cfg.Duration = or(cfg.Duration, DefaultDuration)
	cfg.Uploads = or(cfg.Uploads, DefaultUploads)
	cfg.Downloads = or(cfg.Downloads, DefaultDownloads)
	cfg.Workers = or(cfg.Workers, DefaultWorkers)
	cfg.Stall = or(cfg.Stall, DefaultStall)
	cfg.ProbeInterval = or(cfg.ProbeInterval, DefaultProbeInterval)

	r := &run{cfg: cfg, locked: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range max(cfg.Uploads, 0) {
		wg.Go(func() { r.longTransfer(ctx, i, true) })
	}
	for i := range max(cfg.Downloads, 0) {
		wg.Go(func() { r.longTransfer(ctx, i, false) })
	}
	for i := range max(cfg.Workers, 0) {
		wg.Go(func() { r.worker(ctx, i) })
	}
	wg.Go(func() { r.probe(ctx) })
	if sleepOrLocked(ctx, cfg.Duration, r.locked) {
		// The last word, with the load still on: a new tunnel gets its
		// echo now, however short the run was.
		r.finalProbe(ctx)
	}
	cancel()
	wg.Wait()

	res := Result{
		Probes:   r.probes.Load(),
		Uploaded: r.up.Load(), Downloaded: r.down.Load(), SlowestProbe: time.Duration(r.slowest.Load()),
		FrontendCloses: ShortCount{r.byKind[0][0].Load(), r.byKind[0][1].Load()},
		EndpointCloses: ShortCount{r.byKind[1][0].Load(), r.byKind[1][1].Load()},
	}
	res.Tunnels = res.FrontendCloses.Finished + res.EndpointCloses.Finished
	res.Failed = res.FrontendCloses.Failed + res.EndpointCloses.Failed
	r.mu.Lock()
	defer r.mu.Unlock()
	res.FirstError = r.firstErr
	res.Errors = r.errs
	return res, r.lockErr
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// lockedUp records the first lock-up and ends the run.
func (r *run) lockedUp(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lockErr == nil {
		r.lockErr = fmt.Errorf("%w: %s", ErrLockedUp, fmt.Sprintf(format, args...))
		close(r.locked)
	}
}

// tunnelFailed counts a short tunnel that failed with err.
func (r *run) tunnelFailed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	if r.errs == nil {
		r.errs = map[string]int64{}
	}
	r.errs[errorKind(err)]++
}

// errorKind is what a worker's error says it was doing, before the first
// colon, and how it ended, after the last: "wait for the closer's close:
// ...: connection reset by peer" is "wait for the closer's close /
// connection reset by peer".
func errorKind(err error) string {
	msg := err.Error()
	first, _, found := strings.Cut(msg, ": ")
	if !found {
		return msg
	}
	return first + " / " + msg[strings.LastIndex(msg, ": ")+2:]
}

// dial opens a tunnel to addr that closes when ctx ends, so that a read
// or write blocked on a connection without deadlines (konnectivity-client's)
// returns. end closes it, and must be called once the caller is done.
func (r *run) dial(ctx context.Context, addr string) (c net.Conn, end func(), err error) {
	c, err = r.cfg.Dial(ctx, addr)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	return c, func() { stop(); _ = c.Close() }, nil
}

// longTransfer uploads to the sink or downloads from the source until ctx
// ends, redialling when the tunnel breaks. Every third download reads
// slowly: a few KiB, then a pause.
func (r *run) longTransfer(ctx context.Context, i int, upload bool) {
	slow := !upload && i%3 == 2 && !r.cfg.Gentle
	buf := make([]byte, 32<<10)
	for ctx.Err() == nil {
		addr := r.cfg.Targets.Source
		if upload {
			addr = r.cfg.Targets.Sink
		}
		cctx, cancel := context.WithCancel(ctx)
		c, end, err := r.dial(cctx, addr)
		if err != nil {
			cancel()
			if !sleep(ctx, 50*time.Millisecond) {
				return
			}
			continue
		}
		if !upload {
			_, err = c.Write([]byte{'G'}) // the source's request
		}
		for err == nil && ctx.Err() == nil {
			if upload {
				n, err := c.Write(buf)
				r.up.Add(int64(n))
				if err != nil {
					break
				}
				continue
			}
			b := buf
			if slow {
				b = buf[:4<<10]
			}
			n, err := c.Read(b)
			r.down.Add(int64(n))
			if err != nil {
				break
			}
			if slow && !sleep(ctx, 5*time.Millisecond) {
				break
			}
		}
		end()
		cancel()
	}
}

// worker opens short tunnels one after another until ctx ends.
func (r *run) worker(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(uint64(i), 21))
	for ctx.Err() == nil {
		// Each tunnel must end on its own well within Stall; past it, it
		// is cut and the run has locked up.
		tctx, cancel := context.WithTimeout(ctx, r.cfg.Stall)
		var err error
		if i%2 == 0 {
			err = r.frontendCloses(tctx, rng)
		} else {
			err = r.endpointCloses(tctx, rng)
		}
		hung := tctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return // the run is over: whatever happened is not the tunnel's
		case hung:
			r.lockedUp("a short tunnel neither finished nor failed within %v (worker %d)", r.cfg.Stall, i)
			return
		case err != nil:
			r.byKind[i%2][1].Add(1)
			r.tunnelFailed(err)
		default:
			r.byKind[i%2][0].Add(1)
		}
	}
}

// frontendCloses reads a random amount from the endless source, then
// closes the tunnel while the source still sends.
func (r *run) frontendCloses(ctx context.Context, rng *rand.Rand) error {
	c, end, err := r.dial(ctx, r.cfg.Targets.Source)
	if err != nil {
		return fmt.Errorf("dial the source: %w", err)
	}
	defer end()
	if _, err := c.Write([]byte{'G'}); err != nil {
		return fmt.Errorf("send the source its request: %w", err)
	}
	want := 1 + rng.IntN(256<<10)
	buf := make([]byte, 32<<10)
	for got := 0; got < want; {
		n, err := c.Read(buf)
		got += n
		if err != nil {
			return fmt.Errorf("read from the source after %d of %d bytes: %w", got, want, err)
		}
	}
	return nil
}

// endpointCloses writes to a target that closes after a random amount,
// and keeps writing until the close reaches the frontend as EOF.
func (r *run) endpointCloses(ctx context.Context, rng *rand.Rand) error {
	c, end, err := r.dial(ctx, r.cfg.Targets.Closer)
	if err != nil {
		return fmt.Errorf("dial the closer: %w", err)
	}
	defer end()
	// The first bytes tell the closer how much to read before it closes.
	n := 1 + rng.IntN(256<<10)
	hdr := []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	if _, err := c.Write(hdr); err != nil {
		return fmt.Errorf("write to the closer: %w", err)
	}
	eof := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		eof <- err
	}()
	buf := make([]byte, 16<<10)
	for {
		select {
		case err := <-eof:
			if err != nil {
				return fmt.Errorf("wait for the closer's close: %w", err)
			}
			return nil // the close arrived: the tunnel is done
		default:
		}
		if _, err := c.Write(buf); err != nil {
			// Writes fail once the tunnel is torn down; the read side
			// says whether it ended cleanly.
			_ = c.Close()
			if err := <-eof; err != nil && !errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("wait for the closer's close: %w", err)
			}
			return nil
		}
	}
}

// probe dials the echo target every ProbeInterval and makes one round
// trip. A probe without its echo within Stall, or no successful probe for
// Stall (every dial refused, say), is a lock-up.
func (r *run) probe(ctx context.Context) {
	lastOK := time.Now()
	for i := 0; ; i++ {
		if !sleep(ctx, r.cfg.ProbeInterval) {
			return
		}
		start := time.Now()
		err := r.roundTrip(ctx)
		hung := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		switch {
		case ctx.Err() != nil:
			return
		case hung:
			r.lockedUp("probe %d got no echo within %v (%v)", i, r.cfg.Stall, err)
			return
		case err == nil:
			lastOK = time.Now()
			r.probes.Add(1)
			for d := int64(time.Since(start)); ; {
				old := r.slowest.Load()
				if d <= old || r.slowest.CompareAndSwap(old, d) {
					break
				}
			}
		case time.Since(lastOK) > r.cfg.Stall:
			r.lockedUp("no probe got its echo for %v; the last one failed with %v", r.cfg.Stall, err)
			return
		}
	}
}

// finalProbe retries a probe until one gets its echo; none within Stall
// is a lock-up.
func (r *run) finalProbe(ctx context.Context) {
	deadline := time.Now().Add(r.cfg.Stall)
	for {
		err := r.roundTrip(ctx)
		switch {
		case err == nil:
			r.probes.Add(1)
			return
		case ctx.Err() != nil:
			return
		case time.Now().After(deadline):
			r.lockedUp("the final probe got no echo within %v: %v", r.cfg.Stall, err)
			return
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return
		}
	}
}

// roundTrip dials the echo target and makes one round trip, within
// Stall: a probe. Past Stall the error wraps context.DeadlineExceeded.
func (r *run) roundTrip(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Stall)
	defer cancel()
	err := func() error {
		c, end, err := r.dial(ctx, r.cfg.Targets.Echo)
		if err != nil {
			return err
		}
		defer end()
		msg := []byte("probe")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_, err = io.ReadFull(c, msg)
		return err
	}()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// sleepOrLocked waits d, and reports true, unless ctx ends or locked
// closes first.
func sleepOrLocked(ctx context.Context, d time.Duration, locked <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-locked:
	}
	return false
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	return sleepOrLocked(ctx, d, nil) // a nil channel never closes
}
