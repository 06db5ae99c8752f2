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
// serving until ctx ends or no tunnel is left open.
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

// drainThenStop drains cs and stops it, with stop, once no tunnel is
// open: a drain lets open tunnels finish, so with nothing open there is
// nothing to wait for. That matters beyond saving the operator a second
// signal: the Go runtime merges a signal that arrives before the previous
// one of its kind was handled, so `kill PID; kill PID` often delivers one
// SIGTERM, and an agent waiting for a second one would drain forever.
// For the same reason the drain is bounded by timeout (0: no bound), as
// tunnels such as a followed log can stay open for hours.
func drainThenStop(ctx context.Context, cs *agent.ClientSet, timeout time.Duration, stop context.CancelFunc) {
	if servers, tunnels := cs.Connected(), cs.OpenTunnels(); servers == 0 || tunnels == 0 {
		klog.InfoS("Stopping: nothing to drain", "servers", servers, "tunnels", tunnels)
		stop()
		return
	}
	klog.InfoS("Draining: told the proxy-servers, opening no new connections; stopping once every tunnel is closed or --drain-timeout has passed, or signal again to stop now",
		"servers", cs.Connected(), "tunnels", cs.OpenTunnels(), "drainTimeout", timeout)
	cs.Drain(ctx)
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	switch err := cs.WaitTunnelsClosed(wctx); {
	case err == nil:
		klog.InfoS("Drained: every tunnel is closed, stopping")
	case ctx.Err() != nil:
		return // stopped by a second signal or a failure
	default:
		klog.InfoS("Drain timed out with tunnels open, stopping", "tunnels", cs.OpenTunnels(), "drainTimeout", timeout)
	}
	stop()
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
