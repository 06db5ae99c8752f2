package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/connectivity"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/outage"
	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/servercounter"
)

// ClientSet keeps one Connect stream to each proxy-server it can reach,
// up to a target count, and serves the tunnels the servers ask for.
//
// Build one with [NewClientSet] and call [ClientSet.Run] once. Its methods
// are safe for concurrent use.
type ClientSet struct {
	cfg     Config
	metrics *metrics
	policy  *targetPolicy
	// now is the time of Config.Clock.
	now func() time.Time
	// mono reads the times of the streams' liveness checks: the
	// monotonic clock, which no step of the wall clock moves.
	mono clock.Monotonic
	// serverOutage logs failed server dials at level 0, once per outage.
	serverOutage *outage.Outage
	// serverPort is ServerAddress's port: the port of an address that the
	// Counter lists without one.
	serverPort int

	// dials counts the endpoint dials in flight, bounded by
	// cfg.MaxConcurrentDials; see tryStartDial.
	dials atomic.Int64
	// tunnels counts the tunnels of every stream, dials in flight
	// included.
	tunnels atomic.Int64
	// tunnelEnded wakes WaitTunnelsClosed when a tunnel ends: a buffer of
	// 1 and a non-blocking send, so that ends coalesce.
	tunnelEnded chan struct{}
	// syncNow wakes the sync loop (wakeSync): a server is going away.
	syncNow chan struct{}

	// running is true while Run runs; read by the health handler.
	running atomic.Bool
	// started makes Run run once.
	started atomic.Bool

	// mu guards the fields below it.
	mu sync.Mutex
	// clients are the connected servers by serverID. Guarded by mu.
	clients map[string]*client
	// draining stops the sync loop dialing; set once by Drain. Guarded by
	// mu.
	draining bool
	// lastTarget and lastSource are the target last reported, to log and
	// export changes. Guarded by mu.
	lastTarget int
	lastSource string
	// lastCount is the Counter's last result, answered when a read fails.
	// Guarded by mu.
	lastCount servercounter.Result
	// missingSince is when the agent began to serve on fewer servers than
	// its target, zero while it serves on them all, as the sync loop last
	// saw. Guarded by mu.
	missingSince time.Time
	// dialing holds the addresses of the server dials in flight (see
	// serverDials). Guarded by mu.
	dialing map[string]struct{}
	// nextEndpoint rotates where a resolved dial starts in the endpoint
	// list, so that an unreachable server does not starve the others.
	// Used only by the sync loop.
	nextEndpoint int
	// duplicates counts duplicate dials in a row. Used only by the sync
	// loop.
	duplicates int

	// clientsWG counts the clients' goroutines. Add is called only by the
	// sync loop's dials, which have ended before Run waits.
	clientsWG sync.WaitGroup
}

// NewClientSet validates cfg and returns a ClientSet. The error lists every
// problem of cfg at once; each message names the field.
func NewClientSet(cfg Config) (*ClientSet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	clk := clock.Or(cfg.Clock)
	_, port, _ := net.SplitHostPort(cfg.ServerAddress) // checked by validate
	cs := &ClientSet{
		cfg:  cfg,
		now:  clk.Now,
		mono: clock.NewMonotonic(nil),
		policy: &targetPolicy{
			policy: cfg.TargetPolicy, window: cfg.ReceivedWindow, holdDown: cfg.HoldDown,
			maxCount: cfg.ServerCountMax, now: clk.Now,
		},
		serverOutage: outage.New("connect to proxy-server", clk),
		clients:      make(map[string]*client),
		dialing:      map[string]struct{}{},
		tunnelEnded:  make(chan struct{}, 1),
		syncNow:      make(chan struct{}, 1),
		lastCount:    servercounter.Result{Count: 1, Found: 1, Source: servercounter.SourceFallback},
	}
	cs.serverPort, _ = strconv.Atoi(port) // checked by validate
	m, err := newMetrics(cfg.Registerer, cs.busiestServerTunnels, cs.readinessGauges)
	if err != nil {
		return nil, err
	}
	cs.metrics = m
	m.setOpenServerConnections(0)
	// The first target, exported at once. A constructor waits on no
	// network: the Counter is read with a context that has ended, so a
	// Counter that knows its count (a static one) answers it, and one
	// that would have to wait (leases before their first list, DNS before
	// its first answer) answers later, in Run; the fallback stands until
	// then.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cs.target(ended, cs.count(ended))
	return cs, nil
}

// Config returns the configuration the ClientSet runs with: cfg as
// NewClientSet took it, every default applied.
func (cs *ClientSet) Config() Config { return cs.cfg }

// Connected returns the number of servers held: distinct serverIDs with a
// stream that the agent has not given up on.
func (cs *ClientSet) Connected() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.heldLocked()
}

// heldLocked counts the streams not given up on. Called with mu held.
func (cs *ClientSet) heldLocked() int {
	n := 0
	for _, c := range cs.clients {
		if !c.dropped.Load() {
			n++
		}
	}
	return n
}

// heldChanged exports the number of servers held after a stream was
// given up on.
func (cs *ClientSet) heldChanged() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.metrics.setOpenServerConnections(cs.heldLocked())
}

// serving counts the servers held that are not going away: a server that
// sent DRAIN is shutting down, its tunnels finish, and the sync loop seeks
// another server in its place.
func (cs *ClientSet) serving() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	n := 0
	for _, c := range cs.clients {
		if !c.serverDraining.Load() && !c.dropped.Load() {
			n++
		}
	}
	return n
}

// recount asks the Counter, if it is a servercounter.Refresher, to count
// again soon: a server went away, or a dial to an address it listed
// failed. The Counter's own limits (a cache's MinExpiry and back-off)
// decide when; a burst of asks is one count.
func (cs *ClientSet) recount() {
	if r, ok := cs.cfg.Counter.(servercounter.Refresher); ok {
		r.Refresh()
	}
}

// wakeSync makes the sync loop run a round now.
func (cs *ClientSet) wakeSync() {
	select {
	case cs.syncNow <- struct{}{}:
	default: // a round is asked for already
	}
}

// OpenTunnels returns the number of tunnels open on every stream, dials in
// flight included.
func (cs *ClientSet) OpenTunnels() int { return int(cs.tunnels.Load()) }

// WaitTunnelsClosed returns nil once no tunnel is open (dials in flight
// included), or ctx's error if ctx ends first. A drain is over when it
// returns: nothing is left to finish. One caller at a time.
func (cs *ClientSet) WaitTunnelsClosed(ctx context.Context) error {
	for cs.OpenTunnels() > 0 {
		select {
		case <-cs.tunnelEnded:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// busiestServerTunnels returns the most tunnels open on one stream, for
// the busiest_server_tunnels gauge.
func (cs *ClientSet) busiestServerTunnels() float64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var most int64
	for _, c := range cs.clients {
		most = max(most, c.slots.Load())
	}
	return float64(most)
}

// tryStartDial takes one of the MaxConcurrentDials dial slots, or reports
// that none is free. endDial gives it back.
func (cs *ClientSet) tryStartDial() bool {
	if cs.dials.Add(1) > int64(cs.cfg.MaxConcurrentDials) {
		cs.dials.Add(-1)
		return false
	}
	cs.metrics.dialStarted()
	return true
}

// endDial gives back a slot taken by tryStartDial.
func (cs *ClientSet) endDial() {
	cs.dials.Add(-1)
	cs.metrics.dialEnded()
}

// Drain sends one DRAIN packet on each open stream and stops the sync
// loop opening new server connections. Existing streams keep serving
// tunnels, new ones included. A second call does nothing.
func (cs *ClientSet) Drain(ctx context.Context) {
	cs.mu.Lock()
	if cs.draining {
		cs.mu.Unlock()
		return
	}
	cs.draining = true
	clients := make([]*client, 0, len(cs.clients))
	for _, c := range cs.clients {
		clients = append(clients, c)
	}
	cs.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Draining: sending DRAIN to every server and opening no new server connections", "servers", len(clients))
	for _, c := range clients {
		c.drain() // outside mu: it sends on the stream
	}
}

// isDraining reports whether Drain was called.
func (cs *ClientSet) isDraining() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.draining
}

// Run runs the sync and probe loops until ctx is done. When it returns,
// every stream and endpoint connection is closed and every goroutine the
// ClientSet started has exited. Run may be called once; it returns nil when
// ctx ends.
func (cs *ClientSet) Run(ctx context.Context) error {
	if !cs.started.CompareAndSwap(false, true) {
		return errors.New("agent ClientSet.Run called twice: build a new ClientSet with NewClientSet")
	}
	cs.running.Store(true)
	defer cs.running.Store(false)

	var loops sync.WaitGroup
	loops.Go(func() { cs.syncLoop(ctx) })
	loops.Go(func() { cs.probeLoop(ctx) })
	<-ctx.Done()
	loops.Wait()

	// The sync loop has exited, so no client is added from here on.
	cs.mu.Lock()
	for _, c := range cs.clients {
		c.cancel()
	}
	cs.mu.Unlock()
	cs.clientsWG.Wait()
	return nil
}

// add keeps c as the client of its serverID and starts it, or closes it if
// that server is already connected or ctx is done. It counts the dial's
// result, and an added server's dial before the server shows as
// connected, so that no reader of the metrics or of Connected sees a
// connection without the dial that made it.
func (cs *ClientSet) add(ctx context.Context, c *client) dialResult {
	cs.mu.Lock()
	// A stream given up on is no duplicate: the new one takes its place
	// while it winds down.
	if old, dup := cs.clients[c.serverID]; dup && !old.dropped.Load() || ctx.Err() != nil {
		cs.mu.Unlock()
		res := dialError
		if ctx.Err() == nil {
			res = dialDuplicate
		}
		// Counted before the stream closes: whoever sees it end sees
		// its count.
		cs.metrics.serverDialed(res)
		c.closeUnstarted()
		if res == dialDuplicate {
			// The stream is closed, but its count is news: with
			// SyncForever that is how counts are learnt, as upstream does.
			cs.policy.observeReceived(c.serverCount)
		}
		return res
	}
	cs.metrics.serverDialed(dialOK)
	cs.clients[c.serverID] = c
	drain := cs.draining
	cs.metrics.setOpenServerConnections(cs.heldLocked())
	cs.clientsWG.Add(1)
	cs.mu.Unlock()

	go func() {
		defer cs.clientsWG.Done()
		c.run(ctx, drain)
	}()
	cs.policy.observeReceived(c.serverCount)
	return dialOK
}

// remove forgets c, if it is still the client of its serverID.
func (cs *ClientSet) remove(c *client) {
	cs.mu.Lock()
	if cs.clients[c.serverID] == c {
		delete(cs.clients, c.serverID)
	}
	cs.metrics.setOpenServerConnections(cs.heldLocked())
	cs.mu.Unlock()
}

// probeLoop drops, every ProbeInterval, clients whose gRPC connection has
// failed or whose stream has ended, and checks the liveness of the others
// (heartbeats, a silent server, a stuck receive loop: checkLiveness). The
// receive loop notices most ends first; this catches connections that
// fail without the stream noticing, and servers that die silently.
func (cs *ClientSet) probeLoop(ctx context.Context) {
	ticker := time.NewTicker(cs.cfg.probePeriod())
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		cs.probe(ctx)
	}
}

// probe does one round of the probe loop.
func (cs *ClientSet) probe(ctx context.Context) {
	cs.mu.Lock()
	clients := make([]*client, 0, len(cs.clients))
	for _, c := range cs.clients {
		clients = append(clients, c)
	}
	cs.mu.Unlock()
	now := cs.mono.Now()
	for _, c := range clients {
		switch state := c.cc.GetState(); state {
		case connectivity.TransientFailure, connectivity.Shutdown:
			if c.giveUp() {
				klog.FromContext(ctx).V(2).Info("Dropped proxy-server connection", "serverID", c.serverID, "state", state.String())
			}
		default:
			if c.ended() {
				c.cancel()
			} else {
				c.checkLiveness(now)
			}
		}
	}
}
