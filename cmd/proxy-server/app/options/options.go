// Package options holds the proxy-server's command line: the flags, with
// upstream Konnectivity's names and defaults, their validation, and the
// server configuration they make.
package options

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/flagvalue"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tokenreview"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// Modes of the frontend.
const (
	ModeGRPC        = "grpc"
	ModeHTTPConnect = "http-connect"
)

// Options is the proxy-server's command line.
type Options struct {
	ServerID    string
	ServerCount int
	// ServerCountMax is --server-count-max: the most servers a DNS count
	// reports to agents.
	ServerCountMax int

	Mode    string
	UDSName string

	ServerBindAddress string
	ServerPort        int
	ServerCert        string
	ServerKey         string
	ServerCACert      string

	AgentBindAddress string
	AgentPort        int
	ClusterCert      string
	ClusterKey       string
	ClusterCACert    string
	AgentTokenFile   string

	// InsecurePlaintext serves the agent and frontend ports without TLS,
	// for local use only.
	InsecurePlaintext bool

	HealthBindAddress string
	HealthPort        int
	AdminBindAddress  string
	AdminPort         int
	EnableProfiling   bool

	ProxyStrategies []server.Strategy
	// KeepaliveTime and KeepaliveTimeout are the gRPC keepalive to
	// agents: a ping after KeepaliveTime with nothing received, and the
	// stream ended when its answer does not come within KeepaliveTimeout.
	// It is what finds a stopped upstream agent; ours send heartbeats.
	KeepaliveTime         time.Duration
	KeepaliveTimeout      time.Duration
	FrontendKeepaliveTime time.Duration
	// HeartbeatInterval is the heartbeat interval answered to agents that
	// offer one (0: none).
	HeartbeatInterval time.Duration
	// BackendDialTimeout bounds the wait for an agent's DIAL_RSP (0: no
	// bound, as upstream's flag means), and UnansweredDialTimeout the
	// wait with nothing from the agent before it is taken for
	// unresponsive (0: never).
	BackendDialTimeout      time.Duration
	UnansweredDialTimeout   time.Duration
	GracefulShutdownTimeout time.Duration
	// ShutdownDelay is how long the server keeps taking new frontends
	// after SIGTERM, not ready, before it stops listening.
	ShutdownDelay time.Duration
	// FrontendWriteTimeout bounds the wait for a frontend that does not
	// read; TunnelWindow is the flow-control window granted to our
	// agents per tunnel (-1: none).
	FrontendWriteTimeout time.Duration
	TunnelWindow         int
	// StreamStallTimeout ends an agent stream stuck for that long (0:
	// never).
	StreamStallTimeout       time.Duration
	DeleteExistingUDSFile    bool
	EnableContentionProfiler bool

	// DNS counts servers through their headless Service
	// (--server-count-dns); --server-count is then the fallback.
	DNS *counting.DNSOptions

	// MaxAgentHandshakesPerAddress bounds the agent handshakes in review
	// from one address (0: no bound per address).
	MaxAgentHandshakesPerAddress int

	// Token authentication of agents through TokenReviews, as upstream;
	// TokenReviewQPS and TokenReviewBurst bound the reviews a second.
	AgentNamespace         string
	AgentServiceAccount    string
	AuthenticationAudience string
	TokenReviewQPS         float64
	TokenReviewBurst       int
	// BindAgentIdentifiers lets an agent claim only what its credential
	// proves.
	BindAgentIdentifiers bool

	// Leases publishes this server's Lease (--enable-lease-controller).
	Leases *counting.PublishOptions
	// Kube is the API client of TokenReviews and leases.
	Kube kubeclient.Options

	// TLS is --cipher-suites and --tls-min-version, for every TLS port.
	TLS serve.TLSPolicy

	// XfrChannelSize, FrontendWriteChannelSize and WarnOnChannelLimit are
	// accepted for compatibility; the server's queues have bounds of
	// their own.
	XfrChannelSize           int
	FrontendWriteChannelSize int
	WarnOnChannelLimit       bool
}

// NewOptions returns the defaults: upstream's, so that an existing manifest
// keeps its meaning after a binary swap.
func NewOptions() *Options {
	return &Options{
		FrontendWriteTimeout:         server.DefaultFrontendWriteTimeout,
		StreamStallTimeout:           server.DefaultStreamStallTimeout,
		TunnelWindow:                 wire.DefaultTunnelWindow,
		MaxAgentHandshakesPerAddress: server.DefaultMaxHandshakesPerAddress,
		TokenReviewQPS:               tokenreview.DefaultQPS,
		TokenReviewBurst:             tokenreview.DefaultBurst,
		ServerID:                     serve.IDFromEnv("PROXY_SERVER_ID"),
		DeleteExistingUDSFile:        true,
		ServerCount:                  1,
		ServerCountMax:               servercounter.DefaultMax,
		XfrChannelSize:               10,
		FrontendWriteChannelSize:     10,
		Mode:                         ModeGRPC,
		ServerPort:                   8090,
		AgentPort:                    8091,
		HealthPort:                   8092,
		AdminBindAddress:             "127.0.0.1",
		AdminPort:                    8095,
		ProxyStrategies:              []server.Strategy{server.StrategyDefault},
		KeepaliveTime:                DefaultKeepaliveTime,
		KeepaliveTimeout:             DefaultKeepaliveTimeout,
		FrontendKeepaliveTime:        time.Hour,
		HeartbeatInterval:            wire.DefaultHeartbeat,
		BackendDialTimeout:           server.DefaultBackendDialTimeout,
		UnansweredDialTimeout:        server.DefaultUnansweredDialTimeout,
		GracefulShutdownTimeout:      15 * time.Second,
		DNS:                          counting.NewDNSOptions(),
		Leases:                       counting.NewPublishOptions(),
		Kube:                         kubeclient.Options{ContentType: kubeclient.DefaultContentType},
	}
}

// The gRPC keepalive to agents: a stopped upstream agent (SIGSTOP, a
// frozen node) is dropped within 45 s of its last packet, where
// upstream's server, pinging after an hour, keeps routing dials to it.
// Agents of servercount send heartbeats, which are read activity: they
// never get these pings.
const (
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 15 * time.Second
)

// Flags returns the flags, bound to o.
func (o *Options) Flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("proxy-server", pflag.ContinueOnError)
	fs.StringVar(&o.ServerID, "server-id", o.ServerID, "unique ID of this server, sent to agents (default: $PROXY_SERVER_ID, else random)")
	// The default is drawn anew for every process: --help shows
	// "random" from the usage text rather than this process's draw.
	fs.Lookup("server-id").DefValue = ""
	fs.IntVar(&o.ServerCount, "server-count", o.ServerCount, "number of proxy-server replicas, sent to agents so that they connect to each; with --server-count-dns, the count until DNS answers")
	fs.IntVar(&o.ServerCountMax, "server-count-max", o.ServerCountMax, "with --server-count-dns, never report more proxy-servers to agents than this, whatever DNS says: a broken or hostile answer must not make agents open thousands of connections")
	fs.StringVar(&o.Mode, "mode", o.Mode, "frontend protocol: grpc or http-connect")
	fs.StringVar(&o.UDSName, "uds-name", o.UDSName, "serve the frontend on this Unix socket instead of --server-port")
	fs.BoolVar(&o.DeleteExistingUDSFile, "delete-existing-uds-file", o.DeleteExistingUDSFile, "remove an existing file at --uds-name before listening")
	fs.StringVar(&o.ServerBindAddress, "server-bind-address", o.ServerBindAddress, "address for the frontend port (empty: all interfaces, or loopback with --insecure-plaintext)")
	fs.IntVar(&o.ServerPort, "server-port", o.ServerPort, "frontend port, for kube-apiserver (mTLS; 0: any free port)")
	fs.StringVar(&o.ServerCert, "server-cert", o.ServerCert, "frontend TLS certificate")
	fs.StringVar(&o.ServerKey, "server-key", o.ServerKey, "frontend TLS key")
	fs.StringVar(&o.ServerCACert, "server-ca-cert", o.ServerCACert, "CA that signs frontend client certificates")
	fs.StringVar(&o.AgentBindAddress, "agent-bind-address", o.AgentBindAddress, "address for the agent port (empty: all interfaces, or loopback with --insecure-plaintext)")
	fs.IntVar(&o.AgentPort, "agent-port", o.AgentPort, "port agents connect to (0: any free port)")
	fs.StringVar(&o.ClusterCert, "cluster-cert", o.ClusterCert, "agent-facing TLS certificate")
	fs.StringVar(&o.ClusterKey, "cluster-key", o.ClusterKey, "agent-facing TLS key")
	fs.StringVar(&o.ClusterCACert, "cluster-ca-cert", o.ClusterCACert, "CA that signs agent client certificates (empty: agents need no certificate)")
	fs.StringVar(&o.AgentTokenFile, "agent-token-file", o.AgentTokenFile, "file of bearer tokens agents must present, one per line (empty: no token needed)")
	fs.BoolVar(&o.InsecurePlaintext, "insecure-plaintext", o.InsecurePlaintext, "serve agent and frontend ports without TLS, on loopback unless --agent-bind-address/--server-bind-address say otherwise; for local use only")
	fs.StringVar(&o.HealthBindAddress, "health-bind-address", o.HealthBindAddress, "address for the health port (empty: all)")
	fs.IntVar(&o.HealthPort, "health-port", o.HealthPort, "port for /healthz, /readyz and /metrics (0: any free port)")
	fs.StringVar(&o.AdminBindAddress, "admin-bind-address", o.AdminBindAddress, "address for the admin port")
	fs.IntVar(&o.AdminPort, "admin-port", o.AdminPort, "port for /metrics and, with --enable-profiling, /debug/pprof (0: any free port)")
	fs.BoolVar(&o.EnableProfiling, "enable-profiling", o.EnableProfiling, "serve pprof on the admin port")
	fs.BoolVar(&o.EnableContentionProfiler, "enable-contention-profiling", o.EnableContentionProfiler, "accepted for compatibility; ignored")
	flagvalue.Var(fs, &o.ProxyStrategies, "proxy-strategies", string(server.StrategyDefault), server.ParseStrategies, "comma-separated strategies to pick an agent: default, destHost, defaultRoute")
	fs.DurationVar(&o.KeepaliveTime, "keepalive-time", o.KeepaliveTime, "ping an agent after this long with nothing received from it")
	fs.DurationVar(&o.KeepaliveTimeout, "keepalive-timeout", o.KeepaliveTimeout, "end the stream of an agent whose answer to a keepalive ping does not come within this long")
	fs.DurationVar(&o.FrontendKeepaliveTime, "frontend-keepalive-time", o.FrontendKeepaliveTime, "time between keepalive pings to frontends")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "with agents that offer them (servercount's), send a heartbeat on a stream idle for this long, and end the stream of an agent that sent nothing for 2.5 of its own intervals; 0 sends and expects none")
	fs.DurationVar(&o.BackendDialTimeout, "backend-dial-timeout", o.BackendDialTimeout, "give up on an agent's dial after this long, sending it once to another agent where the strategy allows (0: wait without limit)")
	fs.DurationVar(&o.UnansweredDialTimeout, "unanswered-dial-timeout", o.UnansweredDialTimeout, "take an agent from which nothing arrived for this long after a dial for unresponsive: its dials go to other agents, and it gets new ones only when no other can take them (0: never)")
	fs.DurationVar(&o.FrontendWriteTimeout, "frontend-write-timeout", o.FrontendWriteTimeout, "end a frontend that takes none of its data for this long")
	fs.DurationVar(&o.StreamStallTimeout, "stream-stall-timeout", o.StreamStallTimeout, "end an agent stream on which nothing moved for this long while packets waited to be sent (the agent connects again); 0 never does")
	fs.IntVar(&o.MaxAgentHandshakesPerAddress, "max-agent-handshakes-per-address", o.MaxAgentHandshakesPerAddress, "most agent handshakes whose token is in review from one IP address (an IPv6 /64); beyond, an agent is refused at once and tries again; an address past 10 refused tokens is refused without a check at more than one a second (0: no bound per address, nor on its refusals, for agents behind one SNAT address; 256 in all still hold)")
	fs.IntVar(&o.TunnelWindow, "tunnel-window", o.TunnelWindow, "bytes per tunnel and direction an agent may send ahead of what its frontend has read, with agents that offer flow control (servercount's); -1 turns flow control off")
	fs.DurationVar(&o.GracefulShutdownTimeout, "graceful-shutdown-timeout", o.GracefulShutdownTimeout, "on SIGTERM, how long open tunnels may go on before they are cut (0: cut at once)")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay-duration", o.ShutdownDelay, "on SIGTERM, how long to go on taking new frontends while /readyz fails, so that load balancers and Service endpoints notice, before the server stops listening (as kube-apiserver's flag of that name; 0: stop listening at once)")
	o.DNS.AddFlags(fs, false)
	fs.StringVar(&o.AgentNamespace, "agent-namespace", o.AgentNamespace, "namespace of the agents' service account; with --agent-service-account, agents must present its token, checked with a TokenReview")
	fs.StringVar(&o.AgentServiceAccount, "agent-service-account", o.AgentServiceAccount, "the agents' service account")
	fs.StringVar(&o.AuthenticationAudience, "authentication-audience", o.AuthenticationAudience, "audience agents' tokens must have (empty: the API server's default)")
	fs.BoolVar(&o.BindAgentIdentifiers, "bind-agent-identifiers", o.BindAgentIdentifiers, "let an agent claim in --agent-identifiers only the node its credential proves: with --agent-namespace, the name and addresses of the node its token is bound to (get, list and watch on nodes); else the DNS and IP SANs of its client certificate (--cluster-ca-cert). Other claims are dropped, logged and counted; upstream takes every claim as sent")
	fs.Float64Var(&o.TokenReviewQPS, "token-review-qps", o.TokenReviewQPS, "most TokenReviews of agent tokens sent to the API server a second; --kubeconfig-qps does not apply to them")
	fs.IntVar(&o.TokenReviewBurst, "token-review-burst", o.TokenReviewBurst, "most TokenReviews sent at once after a quiet time, within --token-review-qps")
	fs.StringVar(&o.Kube.Kubeconfig, "kubeconfig", o.Kube.Kubeconfig, "kubeconfig to reach the API server for TokenReviews and leases (empty: in-cluster)")
	fs.StringVar(&o.Kube.ContentType, "kube-api-content-type", o.Kube.ContentType, "content type of requests to the API server")
	fs.Float32Var(&o.Kube.QPS, "kubeconfig-qps", o.Kube.QPS, "most requests per second to the API server, TokenReviews aside (0: client-go's default)")
	fs.IntVar(&o.Kube.Burst, "kubeconfig-burst", o.Kube.Burst, "most requests in a burst to the API server (0: client-go's default)")
	o.Leases.AddFlags(fs)
	serve.CipherSuitesVar(fs, &o.TLS.CipherSuites, "cipher-suites", "comma-separated IANA names of the TLS 1.2 cipher suites every TLS port allows (empty: Go's defaults; TLS 1.3 suites are fixed)")
	flagvalue.Var(fs, &o.TLS.MinVersion, "tls-min-version", "", serve.ParseTLSVersion, "lowest TLS version every TLS port accepts: VersionTLS12 (default) or VersionTLS13")
	fs.IntVar(&o.XfrChannelSize, "xfr-channel-size", o.XfrChannelSize, "accepted for compatibility; ignored")
	// Upstream's server took it after the commit the oracle is built
	// from: each frontend's write queue (0: writes without a queue). Ours
	// queues a frontend's packets in a bounded queue of its own.
	fs.IntVar(&o.FrontendWriteChannelSize, "frontend-write-channel-size", o.FrontendWriteChannelSize, "accepted for compatibility with newer upstream manifests; ignored")
	// Deprecated and hidden upstream, which still accepts it.
	fs.BoolVar(&o.WarnOnChannelLimit, "warn-on-channel-limit", true, "accepted for compatibility; ignored")
	_ = fs.MarkDeprecated("warn-on-channel-limit", "it has no effect and will be removed, as upstream's") // the flag exists
	return fs
}
