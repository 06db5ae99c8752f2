package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/wire"
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
	// nextEndpoint rotates where a resolved dial starts in the endpoint
	// list, so that an unreachable server does not starve the others.
	// Used only by the sync loop.
	nextEndpoint int
	// duplicates counts duplicate dials in a row. Used only by the sync
	// loop.
	duplicates int

	// clientsWG counts the clients' goroutines. Add is called only by the
	// sync loop, which has exited before Run waits.
	clientsWG sync.WaitGroup
}

// NewClientSet validates cfg and returns a ClientSet. The error lists every
// problem of cfg at once; each message names the field.
func NewClientSet(cfg Config) (*ClientSet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	cs := &ClientSet{
		cfg:     cfg,
		metrics: m,
		policy: &targetPolicy{
			counter: cfg.Counter, respectReceived: cfg.RespectReceivedServerCount,
			source: cfg.CountSource, window: cfg.ReceivedWindow, holdDown: cfg.HoldDown, now: cfg.Now,
		},
		clients: make(map[string]*client),
	}
	m.setOpenServerConnections(0)
	cs.Target() // export the first target
	return cs, nil
}

// Target returns the server count currently aimed for.
func (cs *ClientSet) Target() int { return cs.target(context.Background()) }

// target returns the server count aimed for, exporting and logging changes.
func (cs *ClientSet) target(ctx context.Context) int {
	// The policy reads the Counter without mu: it may take its own locks.
	n, src := cs.policy.target(ctx)

	cs.mu.Lock()
	changed := n != cs.lastTarget || src != cs.lastSource
	old, oldSrc := cs.lastTarget, cs.lastSource
	cs.lastTarget, cs.lastSource = n, src
	if changed {
		cs.metrics.setTarget(n, src, oldSrc)
	}
	cs.mu.Unlock()
	if changed && n != old {
		klog.FromContext(ctx).V(2).Info("Server count target changed", "oldCount", old, "newCount", n, "source", src)
	}
	return n
}

// Connected returns the number of servers connected (distinct serverIDs).
func (cs *ClientSet) Connected() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.clients)
}

// Ready reports whether at least one server is connected.
func (cs *ClientSet) Ready() bool { return cs.Connected() > 0 }

// Drain sends one DRAIN packet on each open stream and stops the sync
// loop opening new server connections. Existing streams keep serving
// tunnels, new ones included. A second call does nothing.
func (cs *ClientSet) Drain() {
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
	klog.Background().V(2).Info("Draining: sending DRAIN to every server and opening no new server connections", "servers", len(clients))
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

// syncLoop dials servers while fewer than the target are connected.
func (cs *ClientSet) syncLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// One backoff per loop, never shared: ExponentialBackOff is not safe
	// for concurrent use. MaxElapsedTime 0: the loop runs until ctx ends.
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(cs.cfg.SyncInterval),
		backoff.WithMultiplier(syncBackoffMultiplier),
		backoff.WithRandomizationFactor(syncBackoffJitter),
		backoff.WithMaxInterval(cs.cfg.SyncIntervalCap),
		backoff.WithMaxElapsedTime(0),
	)
	// A Counter that signals changes (a cache refreshing DNS in the
	// background) wakes the loop at once, instead of at its next round.
	notifier, _ := cs.cfg.Counter.(interface{ Changed() <-chan struct{} })
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var changed <-chan struct{}
		if notifier != nil {
			changed = notifier.Changed()
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-changed:
			logger.V(4).Info("Server count changed, syncing now")
		}
		wait := cs.syncRound(ctx, bo)
		cs.metrics.syncRound()
		logger.V(5).Info("Finished sync round", "wait", wait)
		timer.Reset(wait)
	}
}

// syncRound does one round of the sync loop and returns how long to wait
// before the next.
func (cs *ClientSet) syncRound(ctx context.Context, bo *backoff.ExponentialBackOff) time.Duration {
	if cs.isDraining() {
		return cs.cfg.SyncInterval
	}
	target := cs.target(ctx)
	if cs.Connected() >= target && !cs.cfg.SyncForever {
		bo.Reset()
		return cs.cfg.SyncInterval
	}
	res := cs.dialServer(ctx)
	if res != dialDuplicate {
		cs.duplicates = 0
	}
	switch res {
	case dialOK:
		bo.Reset()
		if cs.Connected() < cs.target(ctx) {
			return 0
		}
		return cs.cfg.SyncInterval
	case dialNone:
		return cs.cfg.SyncInterval
	case dialDuplicate:
		// A load balancer picked a server we have: it is up, so try again
		// at once rather than waiting a sync interval per duplicate, as
		// upstream does. With m of T servers missing, a random pick finds
		// one with chance m/T, so duplicateBudget x T/m duplicates in a
		// row happen by chance about once in e^10 (2 in 100000); more
		// likely the count is higher than the servers behind the balancer,
		// and the agent waits a sync interval between dials, as upstream,
		// without growing it: the balancer answers, the servers are up.
		cs.duplicates++
		if missing := target - cs.Connected(); missing > 0 && cs.duplicates <= duplicateBudget*target/missing+1 {
			return 0
		}
		return cs.cfg.SyncInterval
	}
	return min(bo.NextBackOff(), cs.cfg.SyncIntervalCap)
}

// duplicateBudget sets how many duplicate dials in a row the sync loop
// retries at once: duplicateBudget x target / missing servers.
const duplicateBudget = 10

// dialServer opens one gRPC connection and one Connect stream to
// ServerAddress, reads the handshake and adds the server, unless it is
// already connected.
func (cs *ClientSet) dialServer(ctx context.Context) dialResult {
	addr, ok := cs.dialAddress(ctx)
	if !ok {
		return dialNone
	}
	logger := klog.FromContext(ctx).WithValues("serverAddress", addr)
	c, err := cs.connect(ctx, addr)
	if err != nil {
		cs.metrics.serverDialed(dialError)
		logger.V(2).Info("Failed to connect to proxy-server", "err", err)
		return dialError
	}
	res := cs.add(ctx, c)
	cs.metrics.serverDialed(res)
	switch res {
	case dialDuplicate:
		logger.V(4).Info("Closed duplicate connection to proxy-server", "serverID", c.serverID)
	case dialOK:
		logger.V(2).Info("Connected to proxy-server", "serverID", c.serverID, "serverCount", c.serverCount, "connected", cs.Connected())
	}
	return res
}

// dialAddress returns where the next server dial goes: ServerAddress, or
// in DialResolved mode the next endpoint no connected server was reached
// at. ok is false when every endpoint is connected: DNS lists no server to
// add yet.
func (cs *ClientSet) dialAddress(ctx context.Context) (addr string, ok bool) {
	if cs.cfg.DialMode != DialResolved {
		return cs.cfg.ServerAddress, true
	}
	eps, err := cs.cfg.Endpoints(ctx)
	if err != nil || len(eps) == 0 {
		klog.FromContext(ctx).V(4).Info("No server endpoints resolved, dialing the server address", "err", err)
		return cs.cfg.ServerAddress, true
	}
	used := map[string]bool{}
	cs.mu.Lock()
	for _, c := range cs.clients {
		used[c.addr] = true
	}
	cs.mu.Unlock()
	for i := range eps {
		ep := eps[(cs.nextEndpoint+i)%len(eps)]
		if !used[ep] {
			cs.nextEndpoint = (cs.nextEndpoint + i + 1) % len(eps)
			return ep, true
		}
	}
	return "", false
}

// connect dials, opens the stream and checks the handshake headers. On
// success the returned client owns the connection; it is not running yet.
func (cs *ClientSet) connect(ctx context.Context, addr string) (*client, error) {
	md := metadata.Pairs(wire.HeaderAgentID, cs.cfg.AgentID)
	if ids := cs.cfg.Identifiers.String(); ids != "" {
		md.Set(wire.HeaderAgentIdentifiers, ids)
	}
	if cs.cfg.TokenPath != "" {
		tok, err := readToken(cs.cfg.TokenPath)
		if err != nil {
			return nil, err
		}
		md.Set(wire.HeaderAuthorization, "Bearer "+tok)
	}

	// The same windows and message limit as the server's (wire), before
	// the caller's options so that those can override them.
	opts := append([]grpc.DialOption{
		grpc.WithInitialWindowSize(wire.StreamWindow),
		grpc.WithInitialConnWindowSize(wire.ConnWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize)),
	}, cs.cfg.DialOptions...)
	if cs.cfg.Insecure {
		opts = append(opts[:len(opts):len(opts)], grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	// One ClientConn per stream, so that a load balancer can send each to
	// a different server.
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("create gRPC client for %s: %w", addr, err)
	}
	// The stream lives until cancel: the client's lifetime.
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	fail := func(err error) (*client, error) {
		cancel()
		_ = cc.Close() // the error is of no use: the connection is dropped either way
		return nil, err
	}
	// A server that accepts the connection but never answers would hold
	// the sync loop: bound the handshake.
	timedOut := atomic.Bool{}
	timer := time.AfterFunc(cs.cfg.HandshakeTimeout, func() { timedOut.Store(true); cancel() })
	defer timer.Stop()

	stream, err := wire.Connect(sctx, cc)
	if err != nil {
		if timedOut.Load() {
			err = fmt.Errorf("no answer within %v: %w", cs.cfg.HandshakeTimeout, err)
		}
		return fail(fmt.Errorf("open Connect stream to %s: %w", addr, err))
	}
	hdr, err := stream.Header()
	if err != nil {
		if timedOut.Load() {
			err = fmt.Errorf("no answer within %v: %w", cs.cfg.HandshakeTimeout, err)
		}
		return fail(fmt.Errorf("read handshake headers from %s: %w", addr, err))
	}
	if !timer.Stop() {
		return fail(fmt.Errorf("read handshake headers from %s: no answer within %v", addr, cs.cfg.HandshakeTimeout))
	}
	id, count, err := parseHandshake(hdr)
	if err != nil {
		return fail(fmt.Errorf("handshake with %s: %w", addr, err))
	}
	c := newClient(cs, id, count, cc, stream, cancel)
	c.addr = addr
	return c, nil
}

// parseHandshake reads serverID and serverCount from a server's response
// headers: exactly one of each, the count a decimal integer >= 0.
func parseHandshake(hdr metadata.MD) (id string, count int, err error) {
	ids, counts := hdr.Get(wire.HeaderServerID), hdr.Get(wire.HeaderServerCount)
	var errs []error
	if len(ids) != 1 || ids[0] == "" {
		errs = append(errs, fmt.Errorf("got %d %s headers %q, want exactly one non-empty: is this a Konnectivity proxy-server's agent port?", len(ids), wire.HeaderServerID, ids))
	} else {
		id = ids[0]
	}
	if len(counts) != 1 {
		errs = append(errs, fmt.Errorf("got %d %s headers %q, want exactly one", len(counts), wire.HeaderServerCount, counts))
	} else if n, perr := strconv.Atoi(counts[0]); perr != nil || n < 0 {
		errs = append(errs, fmt.Errorf("%s header %q is not a decimal integer >= 0", wire.HeaderServerCount, counts[0]))
	} else {
		count = n
	}
	return id, count, errors.Join(errs...)
}

// readToken reads a bearer token file.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read bearer token (TokenPath): %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("bearer token file %s is empty: write the token to it", path)
	}
	return tok, nil
}

// add keeps c as the client of its serverID and starts it, or closes it if
// that server is already connected or ctx is done.
func (cs *ClientSet) add(ctx context.Context, c *client) dialResult {
	cs.mu.Lock()
	if _, dup := cs.clients[c.serverID]; dup || ctx.Err() != nil {
		cs.mu.Unlock()
		c.closeUnstarted()
		if dup {
			// The stream is closed, but its count is news: with
			// SyncForever that is how counts are learnt, as upstream does.
			cs.policy.observeReceived(c.serverCount)
			return dialDuplicate
		}
		return dialError
	}
	cs.clients[c.serverID] = c
	drain := cs.draining
	cs.metrics.setOpenServerConnections(len(cs.clients))
	cs.clientsWG.Add(1)
	cs.mu.Unlock()

	go func() {
		defer cs.clientsWG.Done()
		c.run(ctx, drain)
	}()
	cs.policy.observeReceived(c.serverCount)
	cs.target(ctx) // export a target changed by the received count
	return dialOK
}

// remove forgets c, if it is still the client of its serverID.
func (cs *ClientSet) remove(c *client) {
	cs.mu.Lock()
	if cs.clients[c.serverID] == c {
		delete(cs.clients, c.serverID)
	}
	n := len(cs.clients)
	cs.metrics.setOpenServerConnections(n)
	cs.mu.Unlock()
}

// probeLoop drops, every ProbeInterval, clients whose gRPC connection has
// failed or whose stream has ended. The receive loop notices most ends
// first; this catches connections that fail without the stream noticing.
func (cs *ClientSet) probeLoop(ctx context.Context) {
	ticker := time.NewTicker(cs.cfg.ProbeInterval)
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
	for _, c := range clients {
		switch state := c.cc.GetState(); state {
		case connectivity.TransientFailure, connectivity.Shutdown:
			klog.FromContext(ctx).V(2).Info("Dropped proxy-server connection", "serverID", c.serverID, "state", state.String())
			c.cancel()
		default:
			if c.ended() {
				c.cancel()
			}
		}
	}
}
