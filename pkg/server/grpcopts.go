package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Transport settings of GRPCServerOptions.
const (
	// grpcStreamWindow and grpcConnWindow are HTTP/2 flow-control windows
	// large enough for one stream to fill a loopback or LAN link: with
	// gRPC's 64 KiB default a tunnel upload runs at about half the speed
	// (see BenchmarkTransfer).
	grpcStreamWindow = 1 << 20
	grpcConnWindow   = 4 << 20
	// grpcMaxRecvMsgSize admits a DATA packet carrying one large write
	// from a konnectivity-client user (it sends each Write as one packet);
	// gRPC's default is 4 MiB.
	grpcMaxRecvMsgSize = 16 << 20
	// grpcMinPingInterval is upstream's enforcement: clients that ping
	// more often are dropped ("too many pings").
	grpcMinPingInterval = 30 * time.Second
)

// GRPCServerOptions returns the transport options that the agent and
// frontend gRPC servers should use with a Server (add credentials to
// them): large flow-control windows, a 16 MiB message limit, and
// upstream's keepalive enforcement (pings no more often than every 30 s,
// allowed without an active stream).
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(grpcStreamWindow),
		grpc.InitialConnWindowSize(grpcConnWindow),
		grpc.MaxRecvMsgSize(grpcMaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcMinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}
