package agent_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

// An agent that keeps a connection to each of three proxy-servers behind
// proxy.example:8091, drains on SIGTERM and serves its health endpoints.
func Example() {
	cfg := agent.DefaultConfig()
	cfg.AgentID = "node-1"
	cfg.ServerAddress = "proxy.example:8091"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ /* CA, client cert */ }))}
	cfg.Counter, cfg.TargetPolicy = servercounter.StaticServerCounter(3), agent.TargetCounted
	cs, err := agent.NewClientSet(cfg)
	if err != nil {
		klog.ErrorS(err, "Invalid agent configuration")
		return
	}
	go func() { _ = http.ListenAndServe("127.0.0.1:8093", cs.Health()) }()

	drain, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-drain.Done()
		cs.Drain(ctx) // a second signal would cancel ctx
	}()
	_ = cs.Run(ctx)
}
