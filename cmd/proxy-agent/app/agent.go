// Package app runs the proxy-agent: it turns options into the agent's
// client set, its health and admin servers, and drains then stops on
// signals.
package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tlsfiles"
	"github.com/servercount/servercount/pkg/agent"
)

// shutdownGrace bounds the stop of the health and admin servers.
const shutdownGrace = 5 * time.Second

// Run builds the agent with New and runs it until ctx ends. When drain
// ends first, the agent drains: it tells every server, stops opening
// connections, and keeps serving until ctx ends or --drain-timeout has
// passed.
func Run(ctx, drain context.Context, cfg options.Config) error {
	a, err := New(cfg, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx, drain)
}

// Agent is one proxy-agent process: the client set from pkg/agent, its
// count sources, its TLS files and its health and admin ports. New does
// everything that can fail and starts nothing that serves; Run serves;
// Close releases what New made.
type Agent struct {
	cfg      options.Config
	reg      serve.Registry
	counter  counting.Counter  // nil without a count source
	tlsFiles *tlsfiles.Watcher // nil with --insecure-plaintext
	cs       *agent.ClientSet

	health, admin net.Listener
	served        bool
}

// New builds the agent from cfg, registers its metrics on reg and listens
// on its health and admin ports. On an error it releases what it made: no
// goroutine, listener or counter is left.
func New(cfg options.Config, reg serve.Registry) (_ *Agent, err error) {
	a := &Agent{cfg: cfg, reg: reg}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if err := serve.RegisterRuntime(reg); err != nil {
		return nil, err
	}
	ac := cfg.Agent
	ac.Registerer = reg
	if cfg.TLS != nil {
		metrics := tlsfiles.NewMetrics("servercount", "agent")
		if err := metric.Register(reg, "TLS file metrics", metrics.Collectors()...); err != nil {
			return nil, err
		}
		if a.tlsFiles, err = tlsfiles.New("agent", *cfg.TLS, metrics, klog.Background()); err != nil {
			return nil, fmt.Errorf("--agent-cert, --agent-key, --ca-cert: %w", err)
		}
		tlsCfg := a.tlsFiles.ClientConfig(cfg.ServerName)
		tlsCfg.NextProtos = cfg.ALPN
		ac.DialOptions = append(slices.Clip(ac.DialOptions), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	}
	if a.counter, err = cfg.Count.Build(cfg.Kube, reg); err != nil {
		return nil, err
	}
	if a.counter != nil {
		ac.Counter = a.counter
	}
	if a.cs, err = agent.NewClientSet(ac); err != nil {
		return nil, err
	}
	if a.health, err = cfg.Health.Listen("health"); err != nil {
		return nil, err
	}
	if a.admin, err = cfg.Admin.Listen("admin"); err != nil {
		return nil, err
	}
	return a, nil
}

// Close releases what New made and Run did not: listeners never served
// and the count sources. It is safe after Run.
func (a *Agent) Close() {
	if !a.served {
		for _, l := range []net.Listener{a.health, a.admin} {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	if a.counter != nil {
		_ = a.counter.Close() // the counters' Close does not fail
	}
}

// Run serves until ctx ends or a server fails; when drain ends first, the
// agent drains (see the package's Run). It is called once.
func (a *Agent) Run(ctx, drain context.Context) error {
	cfg, cs, reg := a.cfg, a.cs, a.reg
	a.served = true
	g := serve.NewGroup()
	if a.tlsFiles != nil {
		// Watched until the agent has stopped, drain included, so that
		// every new connection takes the newest files.
		watchCtx, stopWatching := context.WithCancel(context.WithoutCancel(ctx))
		watched := make(chan struct{})
		go func() { defer close(watched); a.tlsFiles.Run(watchCtx) }()
		defer func() { stopWatching(); <-watched }()
	}
	health := http.NewServeMux()
	health.Handle("/metrics", serve.MetricsHandler(reg))
	health.Handle("/", cs.Health())
	g.HTTP("health server", a.health, health)
	g.HTTP("admin server", a.admin, serve.AdminMux(reg, cfg.EnableProfiling))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.Go("client set", func() error { return cs.Run(runCtx) }, func(context.Context) { cancel() })
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-drain.Done():
			drainThenStop(runCtx, cs, cfg.DrainTimeout, cancel)
		case <-runCtx.Done():
		}
	}()

	klog.InfoS("Proxy-agent started", "agentID", cfg.Agent.AgentID, "proxyServer", cfg.Agent.ServerAddress,
		"healthAddress", a.health.Addr().String(), "adminAddress", a.admin.Addr().String())
	err := g.Wait(ctx, shutdownGrace)
	cancel()
	<-drained
	klog.InfoS("Proxy-agent stopped")
	return err
}

// drainThenStop drains cs as upstream's agent does on its first signal:
// it tells every server, which then chooses other agents for new tunnels
// where there are any, and opens no new server connection, but it keeps
// serving, open tunnels and new ones, until the second signal ends ctx.
// With no server connected there is nothing to drain, and it stops at
// once. Unlike upstream's, the drain is bounded by timeout (0: no bound),
// after which it stops with stop: the Go runtime merges a second `kill` sent
// before the first was handled, and an agent that saw one signal must
// not drain for ever.
func drainThenStop(ctx context.Context, cs *agent.ClientSet, timeout time.Duration, stop context.CancelFunc) {
	if cs.Connected() == 0 {
		// No server to tell and none to route a tunnel here: a drain
		// would wait for nothing (an agent that cannot reach its servers,
		// its API server or DNS must still stop when asked).
		klog.InfoS("Stopping: no proxy-server connected, nothing to drain")
		stop()
		return
	}
	klog.InfoS("Draining: told the proxy-servers, opening no new connections and serving until a second signal or --drain-timeout",
		"servers", cs.Connected(), "tunnels", cs.OpenTunnels(), "drainTimeout", timeout)
	cs.Drain(ctx)
	if timeout <= 0 {
		return // until the second signal
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return // stopped by a second signal or a failure
	case <-t.C:
	}
	klog.InfoS("Drain timed out, stopping", "tunnels", cs.OpenTunnels(), "drainTimeout", timeout)
	stop()
}
