// Package app runs the proxy-agent: it turns options into the agent's
// client set, its health and admin servers, and drains then stops on
// signals.
package app

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/version"
	"github.com/servercount/servercount/pkg/agent"
)

// shutdownGrace bounds the stop of the health and admin servers.
const shutdownGrace = 5 * time.Second

// Run runs the agent until ctx ends. When drain ends first, the agent
// drains: it tells every server, stops opening connections, and keeps
// serving until ctx ends or --drain-timeout has passed.
func Run(ctx, drain context.Context, o *options.Options) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
	cfg, stopCounter, err := o.Config(reg)
	if err != nil {
		return err
	}
	defer stopCounter()
	cs, err := agent.NewClientSet(cfg)
	if err != nil {
		return err
	}

	g := serve.NewGroup()
	hl, err := serve.Listen("health", o.HealthServerHost, o.HealthServerPort)
	if err != nil {
		return err
	}
	health := http.NewServeMux()
	health.Handle("/metrics", serve.MetricsHandler(reg))
	health.Handle("/", cs.Health())
	g.HTTP("health server", hl, health)
	adl, err := serve.Listen("admin", o.AdminBindAddress, o.AdminServerPort)
	if err != nil {
		_ = g.Wait(cancelled(), shutdownGrace)
		return err
	}
	g.HTTP("admin server", adl, serve.AdminMux(reg, o.EnableProfiling))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.Go("client set", func() error { return cs.Run(runCtx) }, func(context.Context) { cancel() })
	go func() {
		select {
		case <-drain.Done():
			drainThenStop(runCtx, cs, o.DrainTimeout, cancel)
		case <-runCtx.Done():
		}
	}()

	klog.InfoS("Proxy-agent started", "agentID", o.AgentID, "proxyServer", cfg.ServerAddress,
		"healthAddress", hl.Addr().String(), "adminAddress", adl.Addr().String())
	err = g.Wait(ctx, shutdownGrace)
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

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
