package proxytest

import (
	"context"
	"flag"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/test/churn"
)

// churnDuration is how long each churn run lasts: a few seconds in
// `make test`, minutes in `make soak`.
var churnDuration = flag.Duration("churn.duration", 4*time.Second, "how long each run of TestChurn lasts")

// churnWindows are the flow-control settings the churn runs under: the
// default window, a small one that cuts nearly every packet, and none.
var churnWindows = []struct {
	name   string
	window int
}{
	{"window=default", 0},
	{"window=16KiB", 16 << 10},
	{"window=off", -1},
}

// Ordinary churn must never lock an agent stream up. Long
// uploads and downloads run beside short tunnels that are closed from
// both ends mid-transfer, some readers slow, over one agent stream, in
// both frontend modes and every window setting. Every tunnel must finish
// or fail, and a new tunnel must get its echo at any moment. On the main
// of 2026-12-04 each of these runs locked up within seconds: the server's
// and the agent's receive loops both waited on their own peer's send path.
func TestChurn(t *testing.T) {
	for _, mode := range frontendModes {
		for _, w := range churnWindows {
			t.Run(mode.name+"/"+w.name, func(t *testing.T) {
				f := startFixture(t, ServerOptions{TunnelWindow: w.window}, func(cfg *agent.Config) { cfg.TunnelWindow = w.window })
				dial := churn.Dialer(f.srv.DialHTTPConnect)
				if mode.name == "grpc" {
					dial = f.srv.dialGRPCWithin
				}
				res, err := churn.Run(t.Context(), churn.Config{
					Dial:     dial,
					Targets:  churn.StartTargets(t),
					Duration: *churnDuration,
				})
				t.Logf("churn: %v; first error: %v", res, res.FirstError)
				if err != nil {
					t.Fatalf("%v\n%s", err, fmt.Sprintf("first tunnel error: %v", res.FirstError))
				}
				if res.Probes == 0 || res.Tunnels == 0 {
					t.Fatalf("the churn made no progress at all: %v", res)
				}
			})
		}
	}
}

// dialGRPCWithin is DialGRPC for a tunnel that ends when ctx does: its
// gRPC connection is closed then.
func (s *Server) dialGRPCWithin(ctx context.Context, addr string) (net.Conn, error) {
	tunnel, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, ctx, s.grpcAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(s.frontendTLS)))
	if err != nil {
		return nil, err
	}
	return tunnel.DialContext(ctx, "tcp", addr)
}
