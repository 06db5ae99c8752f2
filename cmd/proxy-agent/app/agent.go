// Package app runs the proxy-agent: it turns options into the agent's
// client set, its health and admin servers, and drains then stops on
// signals.
package app

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// shutdownGrace bounds the stop of the health and admin servers.
const shutdownGrace = 5 * time.Second

// Config builds the agent configuration from o. Call closeCounter when
// the agent has stopped.
func Config(o *options.Options, reg prometheus.Registerer) (cfg agent.Config, closeCounter func(), err error) {
	cfg = agent.DefaultConfig()
	closeCounter = func() {}
	ids, err := wire.ParseIdentifiers(o.AgentIdentifiers)
	if err != nil {
		return cfg, closeCounter, err
	}
	cfg.AgentID = o.AgentID
	cfg.Identifiers = ids
	cfg.ServerAddress = net.JoinHostPort(o.ProxyServerHost, strconv.Itoa(o.ProxyServerPort))
	cfg.TokenPath = o.ServiceAccountTokenPath
	cfg.SyncInterval, cfg.SyncIntervalCap, cfg.ProbeInterval = o.SyncInterval, o.SyncIntervalCap, o.ProbeInterval
	cfg.SyncForever = o.SyncForever
	cfg.Registerer = reg
	cfg.HoldDown = o.ServerCountHoldDown
	if cfg.CountSource, err = agent.ParseCountSource(o.ServerCountSource); err != nil {
		return cfg, closeCounter, err
	}
	if cfg.DialMode, err = agent.ParseDialMode(o.ServerDialMode); err != nil {
		return cfg, closeCounter, err
	}
	cfg.Counter = servercounter.StaticServerCounter(1)
	if o.DNS.Enabled() {
		cache, err := o.DNS.Build(reg, "agent", o.DNS.Fallback)
		if err != nil {
			return cfg, closeCounter, err
		}
		closeCounter = func() { _ = cache.Close() }
		// With DNS configured, counts received from servers no longer
		// overwrite the target (--server-count-source=max still weighs
		// them).
		cfg.Counter, cfg.RespectReceivedServerCount = cache, false
		cfg.Endpoints = func(ctx context.Context) ([]string, error) {
			res, err := cache.Count(ctx)
			if err != nil || res.Source != servercounter.SourceDNS {
				return nil, err
			}
			return res.Endpoints(o.ProxyServerPort), nil
		}
	}
	cfg.DialOptions = []grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: o.KeepaliveTime, PermitWithoutStream: true})}
	if o.InsecurePlaintext {
		cfg.Insecure = true
		return cfg, closeCounter, nil
	}
	tlsCfg, err := serve.ClientTLS(o.CACert, o.AgentCert, o.AgentKey, o.ProxyServerHost)
	if err != nil {
		closeCounter()
		return cfg, func() {}, err
	}
	tlsCfg.NextProtos = o.ALPN()
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	return cfg, closeCounter, nil
}

// Run runs the agent until ctx ends. When drain ends first, the agent
// drains: it tells every server, stops opening connections, and keeps
// serving until ctx ends.
func Run(ctx, drain context.Context, o *options.Options) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg, closeCounter, err := Config(o, reg)
	if err != nil {
		return err
	}
	defer closeCounter()
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
			klog.InfoS("Draining: told the proxy-servers, opening no new connections; signal again to stop")
			cs.Drain()
		case <-runCtx.Done():
		}
	}()

	klog.InfoS("Proxy-agent started", "agentID", o.AgentID, "proxyServer", cfg.ServerAddress,
		"healthAddress", hl.Addr().String(), "adminAddress", adl.Addr().String())
	err = g.Wait(ctx, shutdownGrace)
	klog.InfoS("Proxy-agent stopped")
	return err
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
