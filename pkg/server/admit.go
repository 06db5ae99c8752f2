package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/wire"
)

// What a peer that has proven nothing may make the server hold, and what
// one agent may. An agent holds one stream per server, on a connection of
// its own; these are many times that.
const (
	// MaxAgentStreamsPerConn bounds the concurrent streams of one agent
	// connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS): each may
	// have a stream window's worth of data buffered before it is read.
	MaxAgentStreamsPerConn = 8
	// DefaultMaxHandshakesPerAddress is Config.MaxHandshakesPerAddress's
	// default.
	DefaultMaxHandshakesPerAddress = 16
	// MaxHandshakes bounds the agent handshakes in progress (their
	// tokens in review) in all: with a stream window each, what peers
	// that have proven nothing may make the server hold is bounded by
	// 256 MiB.
	MaxHandshakes = 256
	// refusedBurst and refusedPerSecond bound the tokens of one address
	// (an IPv6 /64) that a check may refuse: past refusedBurst, one a
	// second. Beyond, its handshakes are refused without a check until
	// the bucket fills again. A flood of bogus tokens from one host then
	// costs the review rate that every agent shares one review a second;
	// an agent that is refused now and then (a token that expired, as
	// agents retry with back-off) never reaches the bound.
	refusedBurst     = 10
	refusedPerSecond = 1
	// maxRefusingAddrs bounds the addresses whose refusals are counted;
	// past it, one is forgotten for each new one.
	maxRefusingAddrs = 4096
	// MaxStreamsPerAgent bounds the streams of one agentID: one per
	// server, and a few more while a reconnect overlaps a stream that
	// has not yet been found dead.
	MaxStreamsPerAgent = 8
)

// handshakes counts the agent handshakes in progress, by peer address,
// and the tokens each address had refused.
type handshakes struct {
	perAddress int         // the bound per address; negative: none
	clock      clock.Clock // the buckets' time; set by New
	mu         sync.Mutex
	n          int
	byAddr     map[netip.Prefix]int
	// refused holds, by address, what is left of its refusedBurst.
	refused map[netip.Prefix]*refusedBucket
}

// errTooManyRefused is what a peer whose tokens were refused too often is
// told.
var errTooManyRefused = errors.New("too many refused agent tokens from this address: try again later")

// errCutOfLate is what a peer whose address had a connection closed of
// late for what it sent before it authenticated is told.
var errCutOfLate = errors.New("a connection from this address sent too much before it authenticated: try again later")

// errTooManyHandshakes is what a peer beyond a handshake bound is told;
// it says nothing of the token.
var errTooManyHandshakes = errors.New("too many agent handshakes in progress: try again")

// enter counts a handshake from the peer of ctx, unless that would pass
// a bound. An address with refused tokens of late needs, for each of its
// handshakes in progress, one of what is left of its refusedBurst: its
// handshakes at once cannot each count on the same one. leave(refused)
// ends the handshake, spending one if its token was refused.
func (h *handshakes) enter(ctx context.Context) (leave func(refused bool), err error) {
	addr := peerPrefix(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= MaxHandshakes || h.perAddress >= 0 && h.byAddr[addr] >= h.perAddress {
		return nil, errTooManyHandshakes
	}
	b := h.refused[addr]
	if b != nil && b.lim.TokensAt(h.clock.Now()) < float64(b.checking+1) {
		return nil, errTooManyRefused
	}
	if h.byAddr == nil {
		h.byAddr = map[netip.Prefix]int{}
	}
	h.n++
	h.byAddr[addr]++
	if b != nil {
		b.checking++
	}
	return func(refused bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.n--
		if h.byAddr[addr]--; h.byAddr[addr] == 0 {
			delete(h.byAddr, addr)
		}
		if b != nil {
			b.checking--
		}
		if refused && h.perAddress >= 0 {
			h.refusedLocked(addr)
		}
	}, nil
}

// refusedBucket is what is left of an address's refusedBurst, and how
// many of its handshakes are being checked.
type refusedBucket struct {
	lim      *rate.Limiter
	checking int
}

// refusedLocked spends one of addr's bucket, which starts full at its
// first refusal. When maxRefusingAddrs are counted, one of them, chosen by
// the map's order, is forgotten for a new one. Called with h.mu held.
func (h *handshakes) refusedLocked(addr netip.Prefix) {
	b := h.refused[addr]
	if b == nil {
		if h.refused == nil {
			h.refused = map[netip.Prefix]*refusedBucket{}
		}
		if len(h.refused) >= maxRefusingAddrs {
			for a := range h.refused {
				delete(h.refused, a)
				break
			}
		}
		b = &refusedBucket{lim: rate.NewLimiter(refusedPerSecond, refusedBurst)}
		h.refused[addr] = b
	}
	b.lim.AllowN(h.clock.Now(), 1) // takes one if there is one; the bucket stays empty else
}

// peerPrefix is the address of ctx's gRPC peer, an IPv6 address's /64
// (one host may hold all of it), the zero Prefix when it has none (a
// Unix socket).
func peerPrefix(ctx context.Context) netip.Prefix {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return netip.Prefix{}
	}
	return addrPrefix(p.Addr)
}

// addrPrefix is peerPrefix for a connection's remote address.
func addrPrefix(remote net.Addr) netip.Prefix {
	if remote == nil {
		return netip.Prefix{}
	}
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(remote.String()); err == nil {
		a = ap.Addr().Unmap()
	} else {
		return netip.Prefix{}
	}
	bits := 32
	if a.Is6() {
		bits = 64
	}
	pfx, _ := a.Prefix(bits) // bits fit a's family
	return pfx
}

// AgentGRPCServerOptions returns [GRPCServerOptions] with what the agent
// port adds (add credentials and keepalive to them):
// [MaxAgentStreamsPerConn] streams per connection, since each stream whose
// token is in review may hold a stream window of data that the handler
// has not read. With Config.MaxHandshakesPerAddress that bounds what one
// address that has proven nothing can make the server hold.
//
// The token cannot be checked before gRPC creates the stream: gRPC calls
// its tap handle with the connection's lock held, so that a review there
// would stop the connection from being closed until it ended.
func AgentGRPCServerOptions() []grpc.ServerOption {
	return append(GRPCServerOptions(), grpc.MaxConcurrentStreams(MaxAgentStreamsPerConn))
}

// admission is the part of a Server that decides whether an agent stream
// is served, before it is: the bounds on connections that have proven
// nothing (preAuth), on handshakes in progress and refused tokens
// (handshakes), the token check and the metadata checks. It takes no lock
// of its own; preAuth and handshakes have theirs.
type admission struct {
	// authenticator is Config.Authenticator: nil means no token is
	// asked for.
	authenticator   TokenAuthenticator
	bindIdentifiers bool // Config.BindIdentifiers
	handshakes      handshakes
	preAuth         preAuthConns
	// Set by New; logs is the Server's, shared with its other parts.
	metrics *metrics
	log     klog.Logger
	logs    *logLimiter
}

// handshake checks the agent's metadata and returns its ID and identifiers,
// or a gRPC status error. Every rejection is logged once, with what the
// agent sent cut by capPeer.
//
// The token is checked first (see admit), and a refused one is answered only
// "authentication failed": why it was refused (which may name a token
// file or carry a TokenReview's error) is logged, never sent to a peer
// that has not proven who it is. The metadata checks come after, so their
// detailed answers reach only agents the server accepts.
func (a *admission) handshake(ctx context.Context) (string, wire.Identifiers, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	agentIDs := md.Get(wire.HeaderAgentID)
	var id Identity
	if a.authenticator != nil {
		var err error
		if id, err = a.admit(ctx, md); err != nil {
			return "", wire.Identifiers{}, err
		}
	} else {
		id, _ = certIdentity(ctx) // none proves nothing
	}
	// Proven: the connection may send what agents send.
	a.preAuth.open(remoteAddr(ctx))
	invalid := func(err error) (string, wire.Identifiers, error) {
		a.rejected(ctx, md, rejectInvalidMetadata, err)
		return "", wire.Identifiers{}, status.Error(codes.InvalidArgument, capPeer(err.Error()))
	}
	if len(agentIDs) != 1 || agentIDs[0] == "" {
		return invalid(fmt.Errorf("want exactly one non-empty %s metadata value, got %d", wire.HeaderAgentID, len(agentIDs)))
	}
	agentID := agentIDs[0]
	var ids wire.Identifiers
	switch v := md.Get(wire.HeaderAgentIdentifiers); len(v) {
	case 0:
	case 1:
		var err error
		if ids, err = wire.ParseIdentifiers(v[0]); err != nil {
			return invalid(err)
		}
		if err := checkIdentifierBounds(ids); err != nil {
			return invalid(err)
		}
	default:
		return invalid(fmt.Errorf("want at most one %s metadata value, got %d", wire.HeaderAgentIdentifiers, len(v)))
	}
	if a.bindIdentifiers {
		var dropped []string
		if ids, dropped = id.bind(ids); len(dropped) > 0 {
			a.metrics.observeUnboundClaims(len(dropped))
			a.logs.info(a.log, "unbound", "Dropped agent identifiers that its credential does not prove: it gets none of their dials", "agentID", capPeer(agentID), "dropped", capPeer(strings.Join(dropped, "&")), "proven", capPeer(id.String()), "remote", remoteAddr(ctx))
		}
	}
	return agentID, ids, nil
}

// admit authenticates the token in md within the handshake bounds, and
// returns the identity it proves (see Config.BindIdentifiers). The error
// is a gRPC status for the peer; why the token was refused is logged and
// counted, not sent.
func (a *admission) admit(ctx context.Context, md metadata.MD) (Identity, error) {
	if a.preAuth.suspect(peerPrefix(ctx)) {
		a.rejected(ctx, md, rejectTooManyCut, errCutOfLate)
		return Identity{}, status.Error(codes.ResourceExhausted, errCutOfLate.Error())
	}
	leave, err := a.handshakes.enter(ctx)
	switch {
	case errors.Is(err, errTooManyRefused):
		a.rejected(ctx, md, rejectTooManyRefused, fmt.Errorf("%w (past %d, %d a second)", err, refusedBurst, refusedPerSecond))
		return Identity{}, status.Error(codes.ResourceExhausted, err.Error())
	case err != nil:
		a.rejected(ctx, md, rejectTooManyHandshakes, fmt.Errorf("%w (at most %d from one address, %d in all)", err, a.handshakes.perAddress, MaxHandshakes))
		return Identity{}, status.Error(codes.ResourceExhausted, err.Error())
	}
	id, err := a.authenticate(ctx, md)
	leave(errors.Is(err, ErrTokenRefused))
	if err != nil {
		a.rejected(ctx, md, rejectUnauthenticated, err)
		return Identity{}, status.Error(codes.Unauthenticated, errTextUnauthenticated)
	}
	return id, nil
}

// rejected logs and counts a refused agent stream. err may quote what the
// agent sent: it is cut as a whole. The lines of each reason are bounded
// (logLimiter); the metric counts every rejection.
func (a *admission) rejected(ctx context.Context, md metadata.MD, reason rejectReason, err error) {
	a.metrics.observeAgentRejection(reason)
	a.logs.error(a.log, "reject/"+string(reason), errors.New(capPeer(err.Error())), "Rejected agent stream",
		"agentID", capPeer(strings.Join(md.Get(wire.HeaderAgentID), ",")), "reason", reason, "remote", remoteAddr(ctx))
}

// errTextUnauthenticated is all an agent learns about a refused token.
const errTextUnauthenticated = "authentication failed"

// authenticate checks the bearer token in md with Config.Authenticator.
// The error says why it was refused, for the log only.
func (a *admission) authenticate(ctx context.Context, md metadata.MD) (Identity, error) {
	auth := md.Get(wire.HeaderAuthorization)
	if len(auth) != 1 {
		return Identity{}, fmt.Errorf("want exactly one %s metadata value \"Bearer <token>\", got %d", wire.HeaderAuthorization, len(auth))
	}
	scheme, token, ok := strings.Cut(auth[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Identity{}, fmt.Errorf("%s metadata is not of the form \"Bearer <token>\"", wire.HeaderAuthorization)
	}
	token = strings.TrimSpace(token)
	var id Identity
	var err error
	if ti, ok := a.authenticator.(TokenIdentifier); ok && a.bindIdentifiers {
		id, err = ti.IdentifyToken(ctx, token)
	} else {
		err = a.authenticator.AuthenticateToken(ctx, token)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("agent token rejected: %w", err)
	}
	return id, nil
}

// refuseTooManyStreams logs, counts and returns the refusal of a stream of
// an agent that holds MaxStreamsPerAgent.
func (a *admission) refuseTooManyStreams(ctx context.Context, agentID string) error {
	err := fmt.Errorf("agent %q: %w (%d)", capPeer(agentID), errTooManyStreams, MaxStreamsPerAgent)
	a.rejected(ctx, metadata.MD{wire.HeaderAgentID: {agentID}}, rejectTooManyStreams, err)
	return status.Error(codes.ResourceExhausted, err.Error())
}
