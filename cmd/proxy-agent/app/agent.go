// Package app runs the proxy-agent: it turns options into the agent's
// client set, its health and admin servers, and drains then stops on
// signals.
package app

import (
	"context"
	"net"
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

// Run builds the agent with New and runs it until ctx ends. When drain
// ends first, the agent drains: it tells every server, stops opening
// connections, and keeps serving until ctx ends or --drain-timeout has
// passed.
func Run(ctx, drain context.Context, o *options.Options) error {
	a, err := New(o, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx, drain)
}

// Agent is one proxy-agent process: the client set from pkg/agent, its
// count sources and its health and admin ports. New does everything that
// can fail and starts nothing that serves; Run serves; Close releases
// what New made.
type Agent struct {
	o           *options.Options
	reg         serve.Registry
	cfg         agent.Config
	stopCounter func()
	cs          *agent.ClientSet

	health, admin net.Listener
	served        bool
}

// New builds the agent, registers its metrics on reg and listens on its
// health and admin ports. On an error it releases what it made.
func New(o *options.Options, reg serve.Registry) (_ *Agent, err error) {
	a := &Agent{o: o, reg: reg}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
	if a.cfg, a.stopCounter, err = o.Config(a.reg); err != nil {
		return nil, err
	}
	if a.cs, err = agent.NewClientSet(a.cfg); err != nil {
		return nil, err
	}
	if a.health, err = serve.Listen("health", o.HealthServerHost, o.HealthServerPort); err != nil {
		return nil, err
	}
	if a.admin, err = serve.Listen("admin", o.AdminBindAddress, o.AdminServerPort); err != nil {
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
	if a.stopCounter != nil {
		a.stopCounter()
	}
}

// Run serves until ctx ends or a server fails; when drain ends first, the
// agent drains (see the package's Run). It is called once.
func (a *Agent) Run(ctx, drain context.Context) error {
	o, cs, reg := a.o, a.cs, a.reg
	a.served = true
	g := serve.NewGroup()
	health := http.NewServeMux()
	health.Handle("/metrics", serve.MetricsHandler(reg))
	health.Handle("/", cs.Health())
	g.HTTP("health server", a.health, health)
	g.HTTP("admin server", a.admin, serve.AdminMux(reg, o.EnableProfiling))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.Go("client set", func() error { return cs.Run(runCtx) }, func(context.Context) { cancel() })
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		select {
		case <-drain.Done():
			drainThenStop(runCtx, cs, o.DrainTimeout, cancel)
		case <-runCtx.Done():
		}
	}()

	klog.InfoS("Proxy-agent started", "agentID", o.AgentID, "proxyServer", a.cfg.ServerAddress,
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
