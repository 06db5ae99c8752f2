// Package app runs the proxy-server: it turns options into listeners,
// gRPC and HTTP servers around pkg/server, and stops them on a signal.
package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/internal/nodes"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tlsfiles"
	"github.com/servercount/servercount/internal/tokenreview"
	"github.com/servercount/servercount/pkg/lease"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// Run builds the server with New, serves until ctx ends and shuts down
// within the grace period.
func Run(ctx context.Context, cfg options.Config) error {
	s, err := New(cfg, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Run(ctx)
}

// Server is one proxy-server process: the core from pkg/server, its count
// source, its four ports and the lease publisher. New does everything
// that can fail (certificates, listeners) and starts nothing that serves;
// Run serves; Close releases what New made.
type Server struct {
	cfg       options.Config
	reg       serve.Registry
	httpConns *prometheus.GaugeVec
	counter   *servercounter.CachedServerCounter // nil without --server-count-dns
	leases    *lease.Publisher                   // nil without --enable-lease-controller
	nodes     *nodes.Addresses                   // nil without --bind-agent-identifiers and TokenReviews
	srv       *server.Server

	agentTLS, frontendTLS *tls.Config
	tlsMetrics            *tlsfiles.Metrics
	tlsFiles              []*tlsfiles.Watcher // watched while Run runs
	// The listeners, closed by Close unless Run has handed them to a
	// server that closes them.
	agents, frontends, health, admin net.Listener
	served                           bool
}

// New builds the server from cfg, registers its metrics on reg and
// listens on its ports. On an error it releases what it made: no
// goroutine, listener or counter is left.
func New(cfg options.Config, reg serve.Registry) (_ *Server, err error) {
	s := &Server{cfg: cfg, reg: reg}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := serve.RegisterRuntime(reg); err != nil {
		return nil, err
	}
	sc := cfg.Server
	sc.Registerer = reg
	if sc.Authenticator, s.leases, err = s.buildKube(); err != nil {
		return nil, err
	}
	if cfg.DNS != nil {
		if s.counter, err = cfg.DNS.Build(reg, "server", cfg.ServerCount, cfg.ServerCountMax); err != nil {
			return nil, err
		}
		sc.Counter = s.counter
	}
	if s.srv, err = server.New(sc); err != nil {
		return nil, err
	}
	s.httpConns = serve.NewHTTPConnectionsGauge("servercount", "server")
	s.tlsMetrics = tlsfiles.NewMetrics("servercount", "server")
	if err := metric.Register(reg, "HTTP connection and TLS file metrics", append(s.tlsMetrics.Collectors(), s.httpConns)...); err != nil {
		return nil, err
	}
	if cfg.AgentTLS != nil {
		if s.agentTLS, err = s.watchTLS("cluster", *cfg.AgentTLS); err != nil {
			return nil, fmt.Errorf("agent port (--cluster-cert, --cluster-key, --cluster-ca-cert): %w", err)
		}
	}
	if cfg.FrontendTLS != nil {
		if s.frontendTLS, err = s.watchTLS("server", *cfg.FrontendTLS); err != nil {
			return nil, fmt.Errorf("frontend port (--server-cert, --server-key, --server-ca-cert): %w", err)
		}
	}
	if s.agents, err = cfg.Agents.Listen("agents"); err != nil {
		return nil, err
	}
	if s.frontends, err = frontendListener(cfg); err != nil {
		return nil, err
	}
	if s.health, err = cfg.Health.Listen("health"); err != nil {
		return nil, err
	}
	if s.admin, err = cfg.Admin.Listen("admin"); err != nil {
		return nil, err
	}
	return s, nil
}

// buildKube builds what talks to the API server: the agents'
// authenticator (a token file or TokenReviews) and the lease publisher.
// Both are idle until used or run.
func (s *Server) buildKube() (server.TokenAuthenticator, *lease.Publisher, error) {
	cfg := s.cfg
	var auth server.TokenAuthenticator
	if cfg.AgentTokenFile != "" {
		var err error
		if auth, err = server.NewTokenFileAuthenticator(cfg.AgentTokenFile); err != nil {
			return nil, nil, err
		}
	}
	var rc *rest.Config
	if cfg.TokenReview != nil || cfg.Leases != nil {
		var err error
		if rc, err = kubeclient.Config(cfg.Kube); err != nil {
			return nil, nil, err
		}
	}
	// Validate admits a token file or TokenReviews, not both.
	if cfg.TokenReview != nil {
		// The authenticator bounds the reviews a second itself
		// (--token-review-qps), where it can count those that wait.
		unlimited := rest.CopyConfig(rc)
		unlimited.QPS = -1
		client, err := kubeclient.NewTokenReviews(unlimited)
		if err != nil {
			return nil, nil, err
		}
		tc := *cfg.TokenReview
		tc.Client, tc.Registerer = client, s.reg
		if cfg.Server.BindIdentifiers {
			// A token proves its node's name; the Node, its addresses.
			if s.nodes, err = nodes.Watch(rc); err != nil {
				return nil, nil, err
			}
			tc.Nodes = s.nodes
		}
		if auth, err = tokenreview.New(tc); err != nil {
			return nil, nil, err
		}
	}
	// Registered with or without leases, as upstream's metrics are.
	leaseMetrics, err := counting.NewPublishMetrics(s.reg)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Leases == nil {
		return auth, nil, nil
	}
	leases, err := cfg.Leases.Build(rc, cfg.Server.ServerID, leaseMetrics)
	return auth, leases, err
}

// watchTLS reads the TLS files of one port and returns its configuration,
// which takes the newest files at each handshake once Run watches them.
func (s *Server) watchTLS(identity string, files tlsfiles.Files) (*tls.Config, error) {
	w, err := tlsfiles.New(identity, files, s.tlsMetrics, klog.Background())
	if err != nil {
		return nil, err
	}
	s.tlsFiles = append(s.tlsFiles, w)
	cfg := w.ServerConfig()
	s.cfg.TLS.Apply(cfg)
	return cfg, nil
}

// Close releases what New made and Run did not: listeners never served,
// the core's tunnels, the count source. It is safe after Run.
func (s *Server) Close() {
	if !s.served {
		for _, l := range []net.Listener{s.agents, s.frontends, s.health, s.admin} {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	if s.srv != nil {
		s.srv.Close()
	}
	if s.counter != nil {
		_ = s.counter.Close() // Close does not fail
	}
}

// watchNodes watches the Nodes in g, and waits, within nodeSyncTimeout,
// until they are listed.
func (s *Server) watchNodes(ctx context.Context, g *serve.Group) {
	nctx, stopNodes := context.WithCancel(context.WithoutCancel(ctx))
	g.Go("node watch", func() error { s.nodes.Run(nctx); return nil }, func(context.Context) { stopNodes() })
	sctx, cancel := context.WithTimeout(ctx, nodeSyncTimeout)
	defer cancel()
	if !s.nodes.Synced(sctx) {
		klog.InfoS("Serving agents before the Nodes were listed: until they are, agents' address claims are dropped (check get, list and watch on nodes in the server's RBAC)", "waited", nodeSyncTimeout)
	}
}

// serveFrontends serves the frontend port in g, in the configured mode,
// and returns what stops taking new frontends, leaving open tunnels be.
func (s *Server) serveFrontends(g *serve.Group) (stop func(context.Context)) {
	fl := s.frontends
	switch s.cfg.Mode {
	case options.ModeGRPC:
		fopts := append(server.GRPCServerOptions(), grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.cfg.FrontendKeepaliveTime}))
		if s.frontendTLS != nil {
			fopts = append(fopts, grpc.Creds(server.TLSCredentials(s.frontendTLS, "frontend", klog.Background())))
		}
		fg := grpc.NewServer(fopts...)
		client.RegisterProxyServiceServer(fg, s.srv)
		g.GRPC("frontend server", fl, fg)
		return func(context.Context) { go fg.GracefulStop() } // waits for the streams: not here
	default: // options.ModeHTTPConnect
		if s.frontendTLS != nil {
			fl = tls.NewListener(fl, s.frontendTLS)
		}
		hs := g.HTTP("frontend server", fl, s.srv.HTTPConnect())
		// Tunnels are hijacked connections, which Shutdown leaves be.
		return func(ctx context.Context) { go func() { _ = hs.Shutdown(ctx) }() }
	}
}

// stopGracefully is the first of a shutdown's steps: not ready and no
// lease at once, new frontends taken for ShutdownDelay, then none; DRAIN
// to agents; open tunnels let run for GracefulShutdownTimeout, the rest
// cut. Only then do the servers stop (GOAWAY to agents).
func (s *Server) stopGracefully(ctx context.Context, stopLeases func(), stopFrontends func(context.Context)) {
	cfg := s.cfg
	s.srv.StopReadiness()
	stopLeases()
	if cfg.ShutdownDelay > 0 {
		klog.InfoS("Shutting down: not ready, still taking new frontends", "shutdownDelay", cfg.ShutdownDelay)
		t := time.NewTimer(cfg.ShutdownDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	stopFrontends(ctx)
	// The agent port sends no GOAWAY until the tunnels have ended or been
	// cut (the servers' own stops come after this step): upstream's agent
	// takes a connection that is no longer ready for lost, and closes
	// every tunnel on it at once, with a clean end of stream. New agent
	// streams are refused meanwhile (Server.Connect), and ours have DRAIN.
	tctx, cancel := context.WithTimeout(ctx, cfg.GracefulShutdownTimeout)
	defer cancel()
	klog.InfoS("Shutting down: taking no new frontends, letting open tunnels finish", "gracefulShutdownTimeout", cfg.GracefulShutdownTimeout)
	if cut := s.srv.Shutdown(tctx); cut > 0 {
		klog.InfoS("Cut the tunnels still open after the grace period", "tunnels", cut, "gracefulShutdownTimeout", cfg.GracefulShutdownTimeout)
	} else {
		klog.InfoS("Every tunnel has ended")
	}
}

// nodeSyncTimeout bounds the wait for the first list of Nodes before the
// agent port serves.
const nodeSyncTimeout = 30 * time.Second

// Run serves on the ports New opened until ctx ends or a server fails,
// then shuts down gracefully: not ready at once, new frontends taken for
// --shutdown-delay-duration, then open tunnels given
// --graceful-shutdown-timeout to end. It is called once.
func (s *Server) Run(ctx context.Context) error {
	cfg, srv, reg := s.cfg, s.srv, s.reg
	s.served = true
	g := serve.NewGroup()
	g.CountHTTPConnections(s.httpConns)
	watchCtx, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
	var watching sync.WaitGroup
	for _, w := range s.tlsFiles {
		watching.Go(func() { w.Run(watchCtx) })
	}
	defer func() { stopWatching(); watching.Wait() }()

	// The Nodes' addresses, before the first agent claims them.
	if s.nodes != nil {
		s.watchNodes(ctx, g)
	}

	// Agents.
	agentOpts := append(server.AgentGRPCServerOptions(), grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout}))
	if s.agentTLS != nil {
		agentOpts = append(agentOpts, grpc.Creds(server.TLSCredentials(s.agentTLS, "agent", klog.Background())))
	}
	agentGRPC := grpc.NewServer(agentOpts...)
	wire.RegisterAgentServiceServer(agentGRPC, srv)
	g.GRPC("agent server", srv.AgentListener(s.agents), agentGRPC)

	// Frontends.
	stopFrontends := s.serveFrontends(g)

	// Health and admin.
	health := http.NewServeMux()
	health.Handle("/metrics", serve.MetricsHandler(reg))
	health.Handle("/", srv.Health())
	g.HTTP("health server", s.health, health)
	g.HTTP("admin server", s.admin, serve.AdminMux(reg, cfg.EnableProfiling))

	// The lease: published once the ports serve, deleted at the start of
	// a shutdown so that agents drop this server at once.
	stopLeases := func() {}
	if s.leases != nil {
		var lctx context.Context
		lctx, stopLeases = context.WithCancel(context.WithoutCancel(ctx))
		g.Go("lease publisher", func() error {
			_ = s.leases.Run(lctx) // it logs its own failures
			return nil
		}, func(context.Context) { stopLeases() })
	}

	// The graceful stop, first of the shutdown's steps; the servers'
	// own stops come after it.
	g.Defer(func(ctx context.Context) { s.stopGracefully(ctx, stopLeases, stopFrontends) })

	klog.InfoS("Proxy-server started", "serverID", cfg.Server.ServerID, "serverCount", cfg.ServerCount, "mode", cfg.Mode,
		"agentAddress", s.agents.Addr().String(), "frontendAddress", s.frontends.Addr().String(),
		"healthAddress", s.health.Addr().String(), "adminAddress", s.admin.Addr().String())
	// The servers' own stops after the tunnels have ended or been cut:
	// a few seconds on top of the delay and the grace period.
	err := g.Wait(ctx, cfg.ShutdownDelay+cfg.GracefulShutdownTimeout+shutdownGrace)
	klog.InfoS("Proxy-server stopped")
	return err
}

// shutdownGrace bounds the stop of what is left once the tunnels have
// ended or been cut: listeners, health and admin servers.
const shutdownGrace = 5 * time.Second

// udsMode is the frontend Unix socket's mode: owner and group may
// connect.
const udsMode = 0o770

// frontendListener listens on the Unix socket or the TCP port.
func frontendListener(cfg options.Config) (net.Listener, error) {
	if cfg.UDSName != "" {
		if cfg.DeleteExistingUDSFile {
			if err := os.Remove(cfg.UDSName); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("remove existing --uds-name %s: %w", cfg.UDSName, err)
			}
		}
		l, err := net.Listen("unix", cfg.UDSName)
		if err != nil {
			return nil, fmt.Errorf("listen for frontends on unix socket %s: %w", cfg.UDSName, err)
		}
		// As upstream's (created under umask 0007): a kube-apiserver in
		// the socket's group may connect, others may not. Until the
		// chmod the socket is 0755 or stricter under the usual umask:
		// connecting needs write permission, so nobody else gets in.
		if err := os.Chmod(cfg.UDSName, udsMode); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("set the mode of unix socket %s: %w", cfg.UDSName, err)
		}
		return l, nil
	}
	return cfg.Frontends.Listen("frontends")
}
