package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/servercount/servercount/pkg/wire"
)

// grpcMinPingInterval is upstream's enforcement: clients that ping more
// often are dropped ("too many pings").
const grpcMinPingInterval = 30 * time.Second

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
// [wire.Codec] for packets, and upstream's keepalive enforcement (pings
// no more often than every 30 s, allowed without an active stream).
//
// gRPC's 32 KiB read buffer per connection was half of what an idle
// agent stream cost the server: over TLS it only copies what crypto/tls
// has already buffered (a whole record), so without it frames are read
// from the TLS connection directly, at the same throughput.
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
