package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

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
	// MaxStreamsPerAgent bounds the streams of one agentID: one per
	// server, and a few more while a reconnect overlaps a stream that
	// has not yet been found dead.
	MaxStreamsPerAgent = 8
)

// handshakes counts the agent handshakes in progress, by peer address.
type handshakes struct {
	perAddress int // the bound per address; negative: none
	mu         sync.Mutex
	n          int
	byAddr     map[netip.Prefix]int
}

// errTooManyHandshakes is what a peer beyond a handshake bound is told;
// it says nothing of the token.
var errTooManyHandshakes = errors.New("too many agent handshakes in progress: try again")

// enter counts a handshake from the peer of ctx, unless that would pass
// a bound. leave undoes it.
func (h *handshakes) enter(ctx context.Context) (leave func(), err error) {
	addr := peerPrefix(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= MaxHandshakes || h.perAddress >= 0 && h.byAddr[addr] >= h.perAddress {
		return nil, errTooManyHandshakes
	}
	if h.byAddr == nil {
		h.byAddr = map[netip.Prefix]int{}
	}
	h.n++
	h.byAddr[addr]++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.n--
		if h.byAddr[addr]--; h.byAddr[addr] == 0 {
			delete(h.byAddr, addr)
		}
	}, nil
}

// peerPrefix is the address of ctx's gRPC peer, an IPv6 address's /64
// (one host may hold all of it), the zero Prefix when it has none (a
// Unix socket).
func peerPrefix(ctx context.Context) netip.Prefix {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Prefix{}
	}
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
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

// admit authenticates the token in md within the handshake bounds. The
// error is a gRPC status for the peer; why the token was refused is
// logged and counted, not sent.
func (s *Server) admit(ctx context.Context, md metadata.MD) error {
	leave, err := s.handshakes.enter(ctx)
	if err != nil {
		s.rejected(ctx, md, RejectTooManyHandshakes, fmt.Errorf("%w (at most %d from one address, %d in all)", err, s.handshakes.perAddress, MaxHandshakes))
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	defer leave()
	if err := s.authenticate(ctx, md); err != nil {
		s.rejected(ctx, md, RejectUnauthenticated, err)
		return status.Error(codes.Unauthenticated, errTextUnauthenticated)
	}
	return nil
}

// rejected logs and counts a refused agent stream. err may quote what the
// agent sent: it is cut as a whole.
func (s *Server) rejected(ctx context.Context, md metadata.MD, reason RejectReason, err error) {
	s.metrics.observeAgentRejection(reason)
	s.log.Error(errors.New(capPeer(err.Error())), "Rejected agent stream", "agentID", capPeer(strings.Join(md.Get(wire.HeaderAgentID), ",")), "reason", reason, "remote", remoteAddr(ctx))
}
