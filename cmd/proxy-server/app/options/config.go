package options

import (
	"time"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tlsfiles"
	"github.com/servercount/servercount/internal/tokenreview"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/servercounter"
)

// listenHost is the host a port listens on: its bind-address flag, or
// loopback for --insecure-plaintext when that is empty, since a port
// without TLS is for local use only.
func (o *Options) listenHost(flagValue string) string {
	if flagValue == "" && o.InsecurePlaintext {
		return "127.0.0.1"
	}
	return flagValue
}

// Config is what the flags decide, as data. Building it reads no file,
// dials nothing and starts nothing: app.New builds the server from it,
// and releases what it built when a later step fails.
type Config struct {
	// Server is the core's configuration but for what app.New adds: the
	// DNS count, the agents' authenticator and the metrics registry. Its
	// Counter is --server-count.
	Server server.Config
	// ServerCount is --server-count: the count, or the DNS count's
	// fallback.
	ServerCount int
	// ServerCountMax bounds the DNS count (--server-count-max).
	ServerCountMax int
	// DNS counts the servers; nil without --server-count-dns.
	DNS *counting.DNSOptions
	// AgentTokenFile holds the tokens agents must present; empty for
	// none. TokenReview checks their service-account tokens instead; nil
	// without --agent-namespace (app.New adds its client and registry).
	AgentTokenFile string
	TokenReview    *tokenreview.Config
	// Leases publishes this server's lease; nil without
	// --enable-lease-controller.
	Leases *counting.PublishOptions
	// Kube is the API server of TokenReviews and leases.
	Kube kubeclient.Options
	// AgentTLS and FrontendTLS name the TLS files of the agent and the
	// frontend port; nil for a port without TLS (--insecure-plaintext, a
	// frontend on --uds-name). TLS applies to both.
	AgentTLS, FrontendTLS *tlsfiles.Files
	TLS                   serve.TLSPolicy
	// Mode is the frontend's protocol: ModeGRPC or ModeHTTPConnect.
	Mode string
	// The ports to listen on. With UDSName the frontend listens on that
	// Unix socket instead, removing a file there first with
	// DeleteExistingUDSFile.
	Agents, Frontends, Health, Admin serve.Address
	UDSName                          string
	DeleteExistingUDSFile            bool
	// KeepaliveTime and FrontendKeepaliveTime space the pings to agents
	// and frontends; KeepaliveTimeout bounds an agent's answer.
	KeepaliveTime, KeepaliveTimeout, FrontendKeepaliveTime time.Duration
	// ShutdownDelay and GracefulShutdownTimeout are the steps of a
	// shutdown: new frontends still taken, then open tunnels let finish.
	ShutdownDelay, GracefulShutdownTimeout time.Duration
	// EnableProfiling serves pprof on the admin port.
	EnableProfiling bool
}

// Config turns the options into the server's configuration. Call it once
// Validate has found no problem.
func (o *Options) Config() Config {
	cfg := Config{
		Server: server.Config{
			ServerID:                o.ServerID,
			Counter:                 servercounter.StaticServerCounter(o.ServerCount),
			Strategies:              o.ProxyStrategies,
			BackendDialTimeout:      serve.Off(o.BackendDialTimeout),
			UnansweredDialTimeout:   serve.Off(o.UnansweredDialTimeout),
			Heartbeat:               serve.Off(o.HeartbeatInterval),
			FrontendWriteTimeout:    o.FrontendWriteTimeout,
			TunnelWindow:            o.TunnelWindow,
			StreamStallTimeout:      serve.Off(o.StreamStallTimeout),
			MaxHandshakesPerAddress: offCount(o.MaxAgentHandshakesPerAddress),
			BindIdentifiers:         o.BindAgentIdentifiers,
		},
		ServerCount:             o.ServerCount,
		ServerCountMax:          o.ServerCountMax,
		AgentTokenFile:          o.AgentTokenFile,
		Kube:                    o.Kube,
		TLS:                     o.TLS,
		Mode:                    o.Mode,
		Agents:                  serve.Address{Host: o.listenHost(o.AgentBindAddress), Port: o.AgentPort},
		Frontends:               serve.Address{Host: o.listenHost(o.ServerBindAddress), Port: o.ServerPort},
		Health:                  serve.Address{Host: o.HealthBindAddress, Port: o.HealthPort},
		Admin:                   serve.Address{Host: o.AdminBindAddress, Port: o.AdminPort},
		UDSName:                 o.UDSName,
		DeleteExistingUDSFile:   o.DeleteExistingUDSFile,
		KeepaliveTime:           o.KeepaliveTime,
		KeepaliveTimeout:        o.KeepaliveTimeout,
		FrontendKeepaliveTime:   o.FrontendKeepaliveTime,
		ShutdownDelay:           o.ShutdownDelay,
		GracefulShutdownTimeout: o.GracefulShutdownTimeout,
		EnableProfiling:         o.EnableProfiling,
	}
	if o.DNS.Enabled() {
		cfg.DNS = o.DNS
	}
	if o.AgentNamespace != "" {
		cfg.TokenReview = &tokenreview.Config{Audience: o.AuthenticationAudience, Namespace: o.AgentNamespace, ServiceAccount: o.AgentServiceAccount,
			QPS: o.TokenReviewQPS, Burst: o.TokenReviewBurst}
	}
	if o.Leases.Enabled {
		cfg.Leases = o.Leases
	}
	if !o.InsecurePlaintext {
		cfg.AgentTLS = &tlsfiles.Files{Cert: o.ClusterCert, Key: o.ClusterKey, CA: o.ClusterCACert}
		if o.UDSName == "" {
			cfg.FrontendTLS = &tlsfiles.Files{Cert: o.ServerCert, Key: o.ServerKey, CA: o.ServerCACert}
		}
	}
	return cfg
}

// offCount is a count flag's value for the library: the flag's 0 (none)
// is the library's negative value, its own 0 being its default.
func offCount(flag int) int {
	if flag == 0 {
		return -1
	}
	return flag
}
