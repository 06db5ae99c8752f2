package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// dialServer opens one gRPC connection and one Connect stream to addr,
// reads the handshake and adds the server, unless it is already
// connected. The sync loop runs it in a goroutine of its own
// (serverDials).
func (cs *ClientSet) dialServer(ctx context.Context, addr string) dialResult {
	logger := klog.FromContext(ctx).WithValues("serverAddress", addr)
	c, err := cs.connect(ctx, addr)
	if err != nil {
		cs.metrics.serverDialed(dialError)
		// At level 0, once per outage: a refused port, a wrong CA or an
		// unresolvable name must show without -v, but not every retry.
		cs.serverOutage.Failed(logger, err, "serverAddress", addr)
		logger.V(2).Info("Failed to connect to proxy-server", "err", err)
		if cs.cfg.DialMode == DialResolved {
			// The address came from the count: it may be gone from it.
			cs.recount()
		}
		return dialError
	}
	res := cs.add(ctx, c) // counts the dial
	if res == dialOK {
		// Not on a duplicate: behind a load balancer with one bad server,
		// reaching a good one again does not end the failure that keeps
		// the agent from its target.
		cs.serverOutage.Recovered(logger, "serverID", c.serverID)
	}
	switch res {
	case dialDuplicate:
		logger.V(4).Info("Closed duplicate connection to proxy-server", "serverID", c.serverID)
	case dialOK:
		logger.V(2).Info("Connected to proxy-server", "serverID", c.serverID, "serverCount", c.serverCount, "connected", cs.Connected())
	}
	return res
}

// dialAddress returns where the next server dial goes at now:
// ServerAddress, or in DialResolved mode the next endpoint of counted
// that no connected server was reached at and no dial is under way to.
// An address in its back-off after a failed dial is passed over. ok is
// false when there is none to dial now; after is then how long until one
// comes out of its back-off (0: none is in one: every endpoint is held or
// being dialled, the count lists no server to add yet).
func (cs *ClientSet) dialAddress(ctx context.Context, counted servercounter.Result, dials *serverDials, now time.Time) (addr string, ok bool, after time.Duration) {
	eps := []string{cs.cfg.ServerAddress}
	if cs.cfg.DialMode == DialResolved {
		if eps = counted.Endpoints(cs.serverPort); len(eps) == 0 {
			klog.FromContext(ctx).V(4).Info("No server endpoints in the count, dialing the server address", "source", counted.Source.String())
			eps = []string{cs.cfg.ServerAddress}
		}
	}
	used := map[string]bool{}
	cs.mu.Lock()
	if cs.cfg.DialMode == DialResolved {
		for _, c := range cs.clients {
			if !c.dropped.Load() {
				used[c.addr] = true
			}
		}
	}
	for a := range cs.dialing {
		used[a] = true
	}
	cs.mu.Unlock()
	for i := range eps {
		ep := eps[(cs.nextEndpoint+i)%len(eps)]
		if used[ep] {
			continue
		}
		if w := dials.waitFor(ep, now); w > 0 {
			if after == 0 || w < after {
				after = w
			}
			continue
		}
		cs.nextEndpoint = (cs.nextEndpoint + i + 1) % len(eps)
		return ep, true, 0
	}
	return "", false, after
}

// handshakeMetadata is what the agent says of itself in the Connect
// handshake: its ID and identifiers, its token (read again each time, as
// the kubelet rotates it), and the flow control and heartbeats it offers.
func (cs *ClientSet) handshakeMetadata() (metadata.MD, error) {
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
	if cs.cfg.TunnelWindow > 0 {
		md.Set(wire.HeaderTunnelWindow, strconv.Itoa(cs.cfg.TunnelWindow))
	}
	if cs.cfg.Heartbeat > 0 {
		md.Set(wire.HeaderHeartbeat, wire.FormatHeartbeat(cs.cfg.Heartbeat))
	}
	return md, nil
}

// dialOptions are the options of a connection to a server: the same
// windows, message limit and codec as the server's (wire), and, as the
// server's, no read buffer of gRPC's own (TLS buffers a whole record
// already), so that an idle connection holds none; before the caller's
// options so that those can override them.
func (cs *ClientSet) dialOptions() []grpc.DialOption {
	opts := append([]grpc.DialOption{
		grpc.WithInitialWindowSize(wire.StreamWindow),
		grpc.WithInitialConnWindowSize(wire.ConnWindow),
		grpc.WithReadBufferSize(0),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize), grpc.ForceCodecV2(wire.Codec{})),
	}, cs.cfg.DialOptions...)
	if cs.cfg.Insecure {
		opts = append(opts[:len(opts):len(opts)], grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	return opts
}

// connect dials, opens the stream and checks the handshake headers. On
// success the returned client owns the connection; it is not running yet.
func (cs *ClientSet) connect(ctx context.Context, addr string) (*client, error) {
	md, err := cs.handshakeMetadata()
	if err != nil {
		return nil, err
	}
	// One ClientConn per stream, so that a load balancer can send each to
	// a different server.
	cc, err := grpc.NewClient(addr, cs.dialOptions()...)
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
	c := newClient(ctx, cs, id, count, cc, stream, cancel)
	c.addr = addr
	if cs.cfg.TunnelWindow > 0 {
		// Flow control is on only if the server answered in kind; an
		// upstream server does not.
		c.peerWindow, _ = wire.ParseTunnelWindow(hdr.Get(wire.HeaderTunnelWindow))
	}
	if cs.cfg.Heartbeat > 0 {
		// On only if the server answered in kind; an upstream server
		// does not.
		c.peerHeartbeat, _ = wire.ParseHeartbeat(hdr.Get(wire.HeaderHeartbeat))
	}
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
