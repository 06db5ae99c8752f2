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

// GRPCServerOptions returns the transport options that the agent and
// frontend gRPC servers should use with a Server (add credentials to
// them): large flow-control windows, a 16 MiB message limit, and
// upstream's keepalive enforcement (pings no more often than every 30 s,
// allowed without an active stream).
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(wire.StreamWindow),
		grpc.InitialConnWindowSize(wire.ConnWindow),
		grpc.MaxRecvMsgSize(wire.MaxMessageSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcMinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}
