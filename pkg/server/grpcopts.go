package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/servercount/servercount/pkg/wire"
)

// grpcMinPingInterval is how often a client may ping: half the least
// gRPC clients can be set to (10 s), so that the jitter of timers and
// scheduling never makes a client at that least look too eager.
// Upstream's servers enforce 30 s and drop clients that ping more often
// ("too many pings"), so that an agent whose --keepalive-time was
// lowered to find a dead server sooner loses its stream to the server it
// wanted to keep; ours let it.
const grpcMinPingInterval = 5 * time.Second

// GRPCMaxHeaderListSize bounds the headers of one gRPC stream, agent or
// frontend. An agent's handshake is an agentID (a UUID), agentIdentifiers
// (a few addresses and names) and a bearer token (a service-account JWT,
// one or two KiB); a frontend sends only gRPC's own headers. 64 KiB is ten
// times the largest of these, where gRPC's default of 16 MiB would let
// each stream of an unauthenticated peer make the server hold, parse and
// log 16 MiB before the handshake is checked.
const GRPCMaxHeaderListSize = 64 << 10

// GRPCServerOptions returns the transport options that the agent and
// frontend gRPC servers should use with a Server (add credentials to
// them): large flow-control windows, a 16 MiB message limit, a
// [GRPCMaxHeaderListSize] header limit, no read buffer of gRPC's own,
// [wire.Codec] for packets, and a keepalive enforcement that allows
// pings every 5 s, with or without an active stream (see
// grpcMinPingInterval).
//
// gRPC's 32 KiB read buffer per connection was half of what an idle
// agent stream cost the server: over TLS it only copies what crypto/tls
// has already buffered (a whole record), so without it frames are read
// from the TLS connection directly, at the same throughput. (Its write
// buffer comes from a pool, and only while a write is flushed: grpc-go's
// default.)
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(wire.StreamWindow),
		grpc.InitialConnWindowSize(wire.ConnWindow),
		grpc.MaxRecvMsgSize(wire.MaxMessageSize),
		grpc.MaxHeaderListSize(GRPCMaxHeaderListSize),
		grpc.ReadBufferSize(0), // see above: TLS buffers already
		grpc.ForceServerCodecV2(wire.Codec{}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcMinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}
