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
	clock      clock.Clock // the buckets' time
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

// admit authenticates the token in md within the handshake bounds, and
// returns the identity it proves (see Config.BindIdentifiers). The error
// is a gRPC status for the peer; why the token was refused is logged and
// counted, not sent.
func (s *Server) admit(ctx context.Context, md metadata.MD) (Identity, error) {
	if s.preAuth.suspect(peerPrefix(ctx)) {
		s.rejected(ctx, md, rejectTooManyCut, errCutOfLate)
		return Identity{}, status.Error(codes.ResourceExhausted, errCutOfLate.Error())
	}
	leave, err := s.handshakes.enter(ctx)
	switch {
	case errors.Is(err, errTooManyRefused):
		s.rejected(ctx, md, rejectTooManyRefused, fmt.Errorf("%w (past %d, %d a second)", err, refusedBurst, refusedPerSecond))
		return Identity{}, status.Error(codes.ResourceExhausted, err.Error())
	case err != nil:
		s.rejected(ctx, md, rejectTooManyHandshakes, fmt.Errorf("%w (at most %d from one address, %d in all)", err, s.handshakes.perAddress, MaxHandshakes))
		return Identity{}, status.Error(codes.ResourceExhausted, err.Error())
	}
	id, err := s.authenticate(ctx, md)
	leave(errors.Is(err, ErrTokenRefused))
	if err != nil {
		s.rejected(ctx, md, rejectUnauthenticated, err)
		return Identity{}, status.Error(codes.Unauthenticated, errTextUnauthenticated)
	}
	return id, nil
}

// rejected logs and counts a refused agent stream. err may quote what the
// agent sent: it is cut as a whole. The lines of each reason are bounded
// (logLimiter); the metric counts every rejection.
func (s *Server) rejected(ctx context.Context, md metadata.MD, reason rejectReason, err error) {
	s.metrics.observeAgentRejection(reason)
	s.logs.error(s.log, "reject/"+string(reason), errors.New(capPeer(err.Error())), "Rejected agent stream",
		"agentID", capPeer(strings.Join(md.Get(wire.HeaderAgentID), ",")), "reason", reason, "remote", remoteAddr(ctx))
}
