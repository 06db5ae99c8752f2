// Package options holds the proxy-agent's command line: every flag of the
// upstream agent, with its name and default so that a manifest keeps working
// after a binary swap, their validation, and the agent configuration they
// make.
package options

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/flagvalue"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tlsfiles"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/wire"
)

// Options is the proxy-agent's command line.
type Options struct {
	AgentID          string
	AgentIdentifiers wire.Identifiers

	ProxyServerHost string
	ProxyServerPort int
	CACert          string
	AgentCert       string
	AgentKey        string
	ALPNProtos      []string
	// InsecurePlaintext connects without TLS, for local use only.
	InsecurePlaintext bool

	ServiceAccountTokenPath string
	// KeepaliveTime and KeepaliveTimeout are the gRPC keepalive: a ping
	// after KeepaliveTime with nothing received, and the connection
	// dropped when its answer does not come within KeepaliveTimeout. It
	// is what finds a dead upstream server; ours send heartbeats.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// HeartbeatInterval is the heartbeat interval offered to servers (0:
	// none).
	HeartbeatInterval time.Duration
	SyncInterval      time.Duration
	SyncIntervalCap   time.Duration
	ProbeInterval     time.Duration
	SyncForever       bool

	// Count are the count-source flags: DNS, leases, the cap, the
	// fallback and how to combine them.
	Count *counting.AgentOptions
	// ServerCountHoldDown is how long a lower count must persist before
	// the agent aims for it.
	ServerCountHoldDown time.Duration
	// ServerDialMode is lb or resolved.
	ServerDialMode agent.DialMode
	// MaxConcurrentDials bounds the endpoint dials in flight, and
	// MaxTunnelsPerServer the tunnels of one server stream: DIAL_REQs over
	// either are refused.
	MaxConcurrentDials  int
	MaxTunnelsPerServer int
	// EndpointWriteTimeout bounds a write to an endpoint; TunnelWindow is
	// the flow-control window offered to servers per tunnel (-1: none).
	EndpointWriteTimeout time.Duration
	TunnelWindow         int
	// StreamStallTimeout ends a server stream stuck for that long (0: never).
	StreamStallTimeout time.Duration
	// DrainTimeout bounds a drain (0: no bound): after the first signal
	// the agent serves until a second one or until this has passed.
	DrainTimeout time.Duration
	// ReadinessAllServers makes /readyz fail while the agent has held
	// fewer servers than it counts for longer than ReadinessGracePeriod.
	ReadinessAllServers  bool
	ReadinessGracePeriod time.Duration

	HealthServerHost         string
	HealthServerPort         int
	AdminBindAddress         string
	AdminServerPort          int
	EnableProfiling          bool
	EnableContentionProfiler bool

	// Kube is the API client of --count-server-leases.
	Kube kubeclient.Options

	// Accepted for compatibility with upstream manifests; they tune what
	// this agent does otherwise, and are ignored.
	WarnOnChannelLimit bool
	XfrChannelSize     int
}

// NewOptions returns upstream's defaults.
func NewOptions() *Options {
	return &Options{
		AgentID:              serve.IDFromEnv("PROXY_AGENT_ID"),
		ProxyServerHost:      "127.0.0.1",
		ProxyServerPort:      8091,
		KeepaliveTime:        DefaultKeepaliveTime,
		KeepaliveTimeout:     DefaultKeepaliveTimeout,
		HeartbeatInterval:    wire.DefaultHeartbeat,
		ReadinessGracePeriod: DefaultReadinessGracePeriod,
		SyncInterval:         agent.DefaultSyncInterval,
		SyncIntervalCap:      agent.DefaultSyncIntervalCap,
		ProbeInterval:        agent.DefaultProbeInterval,
		HealthServerPort:     8093,
		AdminBindAddress:     "127.0.0.1",
		AdminServerPort:      8094,
		Count:                counting.NewAgentOptions(),
		Kube:                 kubeclient.Options{ContentType: kubeclient.DefaultContentType},
		XfrChannelSize:       150,
		ServerCountHoldDown:  agent.DefaultHoldDown,
		ServerDialMode:       agent.DialLoadBalancer,
		MaxConcurrentDials:   agent.DefaultMaxConcurrentDials,
		MaxTunnelsPerServer:  agent.DefaultMaxTunnelsPerServer,
		EndpointWriteTimeout: agent.DefaultEndpointWriteTimeout,
		StreamStallTimeout:   agent.DefaultStreamStallTimeout,
		TunnelWindow:         wire.DefaultTunnelWindow,
		DrainTimeout:         DefaultDrainTimeout,
	}
}

// The gRPC keepalive's defaults: a dead upstream server is dropped
// within 50 s of its last packet, where upstream's agent, pinging after
// an hour, holds it for an hour. 35 s stays above the 30 s that upstream's
// servers enforce between pings (they close the connection of a client
// that pings more often), with room for timers and scheduling. Against
// servercount's servers the heartbeats find a dead one sooner, and these
// pings are never sent: the heartbeats are read activity.
const (
	DefaultKeepaliveTime    = 35 * time.Second
	DefaultKeepaliveTimeout = 15 * time.Second
)

// DefaultReadinessGracePeriod is how long, with --readiness-all-servers,
// a counted server may be missing before /readyz fails: longer than a
// server's replacement takes in a rollout (a new pod, its readiness, the
// agent's next dial), short enough that a server the agent cannot reach
// shows within a minute.
const DefaultReadinessGracePeriod = time.Minute

// DefaultDrainTimeout bounds a drain: long enough for requests in flight
// (kube-apiserver's own timeouts are a minute), short enough that an
// agent whose second signal was lost does not run on for hours.
const DefaultDrainTimeout = 5 * time.Minute

// Flags returns the flags, bound to o.
func (o *Options) Flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("proxy-agent", pflag.ContinueOnError)
	fs.StringVar(&o.AgentID, "agent-id", o.AgentID, "unique ID of this agent (default: $PROXY_AGENT_ID, else random)")
	// The default is random: --help would show this run's random ID as a
	// second default beside "(default: random)". An empty DefValue is
	// what pflag takes for no default.
	fs.Lookup("agent-id").DefValue = ""
	flagvalue.Var(fs, &o.AgentIdentifiers, "agent-identifiers", o.AgentIdentifiers.String(), wire.ParseIdentifiers, "what this agent serves, URL-query encoded: ipv4=, ipv6=, host=, cidr=, default-route=true")
	fs.StringVar(&o.ProxyServerHost, "proxy-server-host", o.ProxyServerHost, "proxy-server host (usually a load balancer); also the TLS server name")
	fs.IntVar(&o.ProxyServerPort, "proxy-server-port", o.ProxyServerPort, "proxy-server agent port")
	fs.StringVar(&o.CACert, "ca-cert", o.CACert, "CA that signs the proxy-servers' certificates (empty: system roots)")
	fs.StringVar(&o.AgentCert, "agent-cert", o.AgentCert, "client certificate for the proxy-servers")
	fs.StringVar(&o.AgentKey, "agent-key", o.AgentKey, "client key for the proxy-servers")
	fs.StringSliceVar(&o.ALPNProtos, "alpn-proto", o.ALPNProtos, "ALPN protocols to offer the proxy-servers")
	fs.BoolVar(&o.InsecurePlaintext, "insecure-plaintext", o.InsecurePlaintext, "connect without TLS; for local use only")
	fs.StringVar(&o.ServiceAccountTokenPath, "service-account-token-path", o.ServiceAccountTokenPath, "file of a bearer token to present to the proxy-servers, re-read on each connection")
	fs.DurationVar(&o.KeepaliveTime, "keepalive-time", o.KeepaliveTime, "ping a proxy-server after this long with nothing received from it (upstream's servers drop agents pinging more often than every 30s)")
	fs.DurationVar(&o.KeepaliveTimeout, "keepalive-timeout", o.KeepaliveTimeout, "drop a proxy-server whose answer to a keepalive ping does not come within this long")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "with proxy-servers that take them up (servercount's), answer the server's heartbeats on a stream idle for half this long and send one on a stream idle for 1.5 times this long, and drop a server that sent nothing for 2.5 of its own intervals; 0 sends and expects none")
	fs.DurationVar(&o.SyncInterval, "sync-interval", o.SyncInterval, "time between attempts to connect to missing proxy-servers")
	fs.DurationVar(&o.SyncIntervalCap, "sync-interval-cap", o.SyncIntervalCap, "longest time between attempts after failures")
	fs.DurationVar(&o.ProbeInterval, "probe-interval", o.ProbeInterval, "time between health checks of server connections (with heartbeats on, at most a quarter of --heartbeat-interval)")
	fs.BoolVar(&o.SyncForever, "sync-forever", o.SyncForever, "keep opening connections even when connected to every server")
	o.Count.AddFlags(fs)
	fs.DurationVar(&o.ServerCountHoldDown, "server-count-hold-down", o.ServerCountHoldDown, "how long a lower server count must persist before the agent aims for it (increases apply at once; 0: none, a lower count applies at once)")
	flagvalue.Var(fs, &o.ServerDialMode, "server-dial-mode", string(o.ServerDialMode), agent.ParseDialMode, "where to dial proxy-servers: lb (--proxy-server-host, as upstream) or resolved (each address --server-count-dns resolves to; TLS server name stays --proxy-server-host)")
	fs.IntVar(&o.MaxConcurrentDials, "max-concurrent-dials", o.MaxConcurrentDials, "most endpoint dials in flight at once, across every proxy-server; a dial request over it is refused at once")
	fs.IntVar(&o.MaxTunnelsPerServer, "max-tunnels-per-server", o.MaxTunnelsPerServer, "most tunnels (dials in flight included) one proxy-server connection may hold open; a dial request over it is refused at once")
	fs.DurationVar(&o.EndpointWriteTimeout, "endpoint-write-timeout", o.EndpointWriteTimeout, "close a tunnel whose endpoint takes none of its data for this long")
	fs.DurationVar(&o.StreamStallTimeout, "stream-stall-timeout", o.StreamStallTimeout, "end and redial a proxy-server stream on which nothing moved for this long while packets waited to be sent; 0 never does")
	fs.IntVar(&o.TunnelWindow, "tunnel-window", o.TunnelWindow, "bytes per tunnel and direction a proxy-server may send ahead of what the endpoint has read, with servers that take up flow control (servercount's); -1 turns flow control off")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "after the first SIGTERM, drain and keep serving until a second signal or until this has passed (0: no bound)")
	fs.BoolVar(&o.ReadinessAllServers, "readiness-all-servers", o.ReadinessAllServers, "make /readyz fail (503) while the agent has held fewer proxy-servers than it counts for longer than --readiness-grace-period; by default /readyz passes with one server, as upstream's")
	fs.DurationVar(&o.ReadinessGracePeriod, "readiness-grace-period", o.ReadinessGracePeriod, "with --readiness-all-servers, how long a counted server may be missing before /readyz fails (0: at once)")
	fs.StringVar(&o.HealthServerHost, "health-server-host", o.HealthServerHost, "address for the health port (empty: all)")
	fs.IntVar(&o.HealthServerPort, "health-server-port", o.HealthServerPort, "port for /healthz, /readyz and /metrics (0: any free port)")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address for the admin port")
	fs.IntVar(&o.AdminServerPort, "admin-server-port", o.AdminServerPort, "port for /metrics and, with --enable-profiling, /debug/pprof (0: any free port)")
	fs.BoolVar(&o.EnableProfiling, "enable-profiling", o.EnableProfiling, "serve pprof on the admin port")
	fs.BoolVar(&o.EnableContentionProfiler, "enable-contention-profiling", o.EnableContentionProfiler, "accepted for compatibility; ignored")
	fs.StringVar(&o.Kube.Kubeconfig, "kubeconfig", o.Kube.Kubeconfig, "kubeconfig to reach the API server with --count-server-leases (empty: in-cluster)")
	fs.StringVar(&o.Kube.ContentType, "kube-api-content-type", o.Kube.ContentType, "content type of requests to the API server")
	fs.BoolVar(&o.WarnOnChannelLimit, "warn-on-channel-limit", o.WarnOnChannelLimit, "accepted for compatibility; ignored")
	fs.IntVar(&o.XfrChannelSize, "xfr-channel-size", o.XfrChannelSize, "accepted for compatibility; ignored")
	return fs
}

// Validate returns every problem with o, each naming its flag.
func (o *Options) Validate() []error {
	var errs []error
	if o.AgentID == "" {
		errs = append(errs, errors.New("--agent-id must not be empty"))
	}
	if o.ProxyServerHost == "" {
		errs = append(errs, errors.New("--proxy-server-host must not be empty"))
	}
	errs = append(errs, serve.CheckPorts(map[string]int{"--proxy-server-port": o.ProxyServerPort, "--health-server-port": o.HealthServerPort, "--admin-server-port": o.AdminServerPort})...)
	if o.ProxyServerPort == 0 {
		errs = append(errs, errors.New("--proxy-server-port must be set"))
	}
	if (o.AgentCert == "") != (o.AgentKey == "") {
		errs = append(errs, errors.New("--agent-cert and --agent-key go together: set both or neither"))
	}
	if o.InsecurePlaintext && (o.CACert != "" || o.AgentCert != "") {
		errs = append(errs, errors.New("--insecure-plaintext excludes --ca-cert, --agent-cert and --agent-key"))
	} else if !o.InsecurePlaintext && (o.AgentCert == "") == (o.AgentKey == "") {
		// Read now, so that a missing or bad file is refused at start-up
		// with its flag's name.
		errs = append(errs, tlsfiles.Check(tlsfiles.Files{Cert: o.AgentCert, Key: o.AgentKey, CA: o.CACert},
			tlsfiles.Files{Cert: "--agent-cert", Key: "--agent-key", CA: "--ca-cert"})...)
	}
	if o.SyncInterval <= 0 || o.ProbeInterval <= 0 {
		errs = append(errs, errors.New("--sync-interval and --probe-interval must be positive"))
	}
	errs = append(errs, serve.CheckLivenessFlags(o.KeepaliveTime, o.KeepaliveTimeout, o.HeartbeatInterval)...)
	if o.ReadinessGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("invalid --readiness-grace-period %v: must not be negative", o.ReadinessGracePeriod))
	}
	if o.SyncIntervalCap < o.SyncInterval {
		errs = append(errs, fmt.Errorf("--sync-interval-cap %v must be at least --sync-interval %v", o.SyncIntervalCap, o.SyncInterval))
	}
	errs = append(errs, o.Count.Validate()...)
	if o.ServerCountHoldDown < 0 {
		errs = append(errs, fmt.Errorf("invalid --server-count-hold-down %v: must not be negative", o.ServerCountHoldDown))
	}
	if o.ServerDialMode == agent.DialResolved && !o.Count.DNS.Enabled() {
		errs = append(errs, errors.New("--server-dial-mode=resolved needs --server-count-dns: the addresses to dial come from it"))
	}
	if o.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("invalid --drain-timeout %v: must not be negative (0: no bound)", o.DrainTimeout))
	}
	if o.MaxConcurrentDials < 1 {
		errs = append(errs, fmt.Errorf("invalid --max-concurrent-dials %d: must be at least 1", o.MaxConcurrentDials))
	}
	if o.MaxTunnelsPerServer < 1 {
		errs = append(errs, fmt.Errorf("invalid --max-tunnels-per-server %d: must be at least 1", o.MaxTunnelsPerServer))
	}
	errs = append(errs, serve.CheckStreamFlags(o.StreamStallTimeout, "--endpoint-write-timeout", o.EndpointWriteTimeout, o.TunnelWindow)...)
	return errs
}

// Config is what the flags decide, as data. Building it reads no file,
// dials nothing and starts nothing: app.New builds the agent from it, and
// releases what it built when a later step fails.
type Config struct {
	// Agent is the client set's configuration but for what app.New adds:
	// the count (from Count), the TLS credentials (from TLS) and the
	// metrics registry.
	Agent agent.Config
	// TLS names the files of the agent's certificate, key and CA; nil
	// with --insecure-plaintext. ServerName and ALPN complete the TLS
	// configuration.
	TLS        *tlsfiles.Files
	ServerName string
	ALPN       []string
	// Count are the count sources, and Kube the API server that
	// --count-server-leases reads.
	Count *counting.AgentOptions
	Kube  kubeclient.Options
	// Health and Admin are the ports to listen on.
	Health, Admin serve.Address
	// EnableProfiling serves pprof on the admin port.
	EnableProfiling bool
	// DrainTimeout bounds a drain (0: no bound).
	DrainTimeout time.Duration
}

// Config turns the options into the agent's configuration. Call it once
// Validate has found no problem.
func (o *Options) Config() Config {
	a := agent.DefaultConfig()
	a.AgentID = o.AgentID
	a.Identifiers = o.AgentIdentifiers
	a.ServerAddress = net.JoinHostPort(o.ProxyServerHost, strconv.Itoa(o.ProxyServerPort))
	a.TokenPath = o.ServiceAccountTokenPath
	a.SyncInterval, a.SyncIntervalCap, a.ProbeInterval = o.SyncInterval, o.SyncIntervalCap, o.ProbeInterval
	a.SyncForever = o.SyncForever
	a.HoldDown = serve.Off(o.ServerCountHoldDown)
	a.DialMode = o.ServerDialMode
	a.TargetPolicy = targetPolicy(o.Count)
	// Every count is capped, received ones included and whatever the
	// source: a server's serverCount header is not to be trusted more
	// than DNS is.
	a.ServerCountMax = o.Count.Max
	a.MaxConcurrentDials, a.MaxTunnelsPerServer = o.MaxConcurrentDials, o.MaxTunnelsPerServer
	a.EndpointWriteTimeout, a.TunnelWindow = o.EndpointWriteTimeout, o.TunnelWindow
	a.StreamStallTimeout = serve.Off(o.StreamStallTimeout)
	a.Insecure = o.InsecurePlaintext
	a.Heartbeat = serve.Off(o.HeartbeatInterval)
	a.DialOptions = []grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: o.KeepaliveTime, Timeout: o.KeepaliveTimeout, PermitWithoutStream: true})}
	a.ReadyWhenAll, a.ReadinessGracePeriod = o.ReadinessAllServers, o.ReadinessGracePeriod
	cfg := Config{
		Agent:           a,
		ServerName:      o.ProxyServerHost,
		ALPN:            o.ALPN(),
		Count:           o.Count,
		Kube:            o.Kube,
		Health:          serve.Address{Host: o.HealthServerHost, Port: o.HealthServerPort},
		Admin:           serve.Address{Host: o.AdminBindAddress, Port: o.AdminServerPort},
		EnableProfiling: o.EnableProfiling,
		DrainTimeout:    o.DrainTimeout,
	}
	if !o.InsecurePlaintext {
		cfg.TLS = &tlsfiles.Files{Cert: o.AgentCert, Key: o.AgentKey, CA: o.CACert}
	}
	return cfg
}

// ALPN returns the ALPN protocols to offer. pflag prints an empty string
// slice as "[]", and tools that pass every flag back as --name=value send
// that literally: it means none.
func (o *Options) ALPN() []string {
	var protos []string
	for _, p := range o.ALPNProtos {
		if p != "" && p != "[]" {
			protos = append(protos, p)
		}
	}
	return protos
}

// targetPolicy is how the agent weighs its own count (c's sources)
// against the counts servers report: without a source of its own,
// upstream's way (what servers report); with one, that source's.
// --server-count-source=max takes the larger of the two either way.
func targetPolicy(c *counting.AgentOptions) agent.TargetPolicy {
	switch {
	case c.SourceMax:
		return agent.TargetMax
	case c.Counts():
		return agent.TargetCounted
	}
	return agent.TargetReceived
}
