package agent

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// maxBackoffAddrs bounds the addresses whose back-off is kept: the count
// lists a bounded number of servers, but over a long life it may list
// many in turn.
const maxBackoffAddrs = 1024

// serverDials is the sync loop's server dials: those in flight, each in a
// goroutine of its own, and the back-off of each address whose last dial
// failed. Only the sync loop uses it, but for the goroutines' sends on
// done; the addresses in flight are also kept in ClientSet.dialing, for
// Readiness.
type serverDials struct {
	cfg  Config
	done chan dialOutcome
	wg   sync.WaitGroup
	n    int // dials in flight
	// backoff holds, by address, the back-off of one whose last dial
	// failed and when it may be dialled again. One back-off per address,
	// never shared: ExponentialBackOff is not safe for concurrent use, and
	// an address that fails must not delay another.
	backoff map[string]*addrBackoff
}

// addrBackoff is one address's back-off.
type addrBackoff struct {
	bo *backoff.ExponentialBackOff
	at time.Time // not dialled before
}

// dialOutcome is how a server dial to addr ended.
type dialOutcome struct {
	addr string
	res  dialResult
}

func newServerDials(cfg Config) *serverDials {
	return &serverDials{cfg: cfg, done: make(chan dialOutcome), backoff: map[string]*addrBackoff{}}
}

// inFlight is the number of dials in flight.
func (d *serverDials) inFlight() int { return d.n }

// start dials addr in a goroutine of its own; its outcome comes on done,
// unless ctx ends first.
func (d *serverDials) start(ctx context.Context, cs *ClientSet, addr string) {
	d.n++
	cs.mu.Lock()
	cs.dialing[addr] = struct{}{}
	cs.mu.Unlock()
	d.wg.Go(func() {
		res := cs.dialServer(ctx, addr)
		select {
		case d.done <- dialOutcome{addr: addr, res: res}:
		case <-ctx.Done():
		}
	})
}

// ended takes addr out of the dials in flight.
func (d *serverDials) ended(cs *ClientSet, addr string) {
	d.n--
	cs.mu.Lock()
	delete(cs.dialing, addr)
	cs.mu.Unlock()
}

// wait waits for the dials' goroutines, which end with the loop's ctx.
func (d *serverDials) wait() { d.wg.Wait() }

// succeeded forgets addr's back-off.
func (d *serverDials) succeeded(addr string) { delete(d.backoff, addr) }

// failed starts or grows addr's back-off, from SyncInterval, with jitter,
// up to SyncIntervalCap.
func (d *serverDials) failed(addr string, now time.Time) {
	b := d.backoff[addr]
	if b == nil {
		if len(d.backoff) >= maxBackoffAddrs {
			clear(d.backoff)
		}
		// MaxElapsedTime 0: an address is tried for as long as the count
		// lists it.
		b = &addrBackoff{bo: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(d.cfg.SyncInterval),
			backoff.WithMultiplier(syncBackoffMultiplier),
			backoff.WithRandomizationFactor(syncBackoffJitter),
			backoff.WithMaxInterval(d.cfg.SyncIntervalCap),
			backoff.WithMaxElapsedTime(0),
		)}
		d.backoff[addr] = b
	}
	b.at = now.Add(min(b.bo.NextBackOff(), d.cfg.SyncIntervalCap))
}

// holdOff keeps addr from being dialled before at, its back-off as it
// is.
func (d *serverDials) holdOff(addr string, at time.Time) {
	b := d.backoff[addr]
	if b == nil {
		d.failed(addr, at.Add(-d.cfg.SyncInterval)) // makes one, for a sync interval
		return
	}
	b.at = at
}

// waitFor returns how long before addr may be dialled at now: 0 when it
// may be now.
func (d *serverDials) waitFor(addr string, now time.Time) time.Duration {
	if b := d.backoff[addr]; b != nil && now.Before(b.at) {
		return b.at.Sub(now)
	}
	return 0
}

// dialingList is the addresses being dialled, sorted and joined, for
// Readiness. Called with ClientSet.mu held.
func (cs *ClientSet) dialingListLocked() string {
	addrs := make([]string, 0, len(cs.dialing))
	for a := range cs.dialing {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	return strings.Join(addrs, ",")
}
