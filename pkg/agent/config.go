package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// Defaults of [Config]; they are upstream's defaults where upstream has the
// same setting.
const (
	// DefaultSyncInterval is the wait between sync rounds, and the first
	// wait after a failed server dial.
	DefaultSyncInterval = time.Second
	// DefaultSyncIntervalCap caps the wait after repeated failed dials.
	DefaultSyncIntervalCap = 10 * time.Second
	// DefaultProbeInterval is how often server connections are checked.
	DefaultProbeInterval = time.Second
	// DefaultDialTimeout bounds one endpoint dial (upstream: 5 s).
	DefaultDialTimeout = 5 * time.Second
	// DefaultEndpointWriteTimeout bounds one write to an endpoint: an
	// endpoint that takes no data for that long loses its tunnel.
	DefaultEndpointWriteTimeout = 10 * time.Second
	// DefaultHandshakeTimeout bounds one server dial, from opening the
	// stream to reading the server's response headers.
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultHoldDown is how long a lower server count must persist before
	// the agent aims for it.
	DefaultHoldDown = 30 * time.Second
	// DefaultReceivedWindow is how many received serverCount headers the
	// agent remembers; it aims for the largest.
	DefaultReceivedWindow = 5
	// DefaultServerCountMax caps every server count, received or counted:
	// a hostile or broken server must not make the agent open thousands
	// of connections. It is servercounter.DefaultMax, --server-count-max's
	// default in both binaries: a server's count ends up as an agent's
	// target.
	DefaultServerCountMax = servercounter.DefaultMax
	// DefaultMaxConcurrentDials bounds the endpoint dials in flight across
	// every server stream. A dial holds a goroutine and a socket for up to
	// DialTimeout; a healthy dial takes milliseconds, so 500 at once is
	// thousands of tunnels a second, while a server flooding DIAL_REQs to
	// addresses that hang holds at most 500 sockets.
	DefaultMaxConcurrentDials = 500
	// DefaultMaxTunnelsPerServer bounds the tunnels (dials in flight
	// included) one server stream may hold open. Each is a socket: 5000
	// per stream is more than one kube-apiserver of a 5000-node cluster
	// keeps through one agent (logs, exec, port-forward, webhooks), and
	// far below the file limit of a container.
	DefaultMaxTunnelsPerServer = 5000
	// DefaultStreamStallTimeout is how long nothing may move on a server
	// stream while packets wait to be sent before the agent ends it and
	// dials again: well above every bounded wait of a healthy stream (the
	// 10 s write timeouts of endpoints and frontends), so that only a
	// stream that is truly stuck is ended.
	DefaultStreamStallTimeout = 30 * time.Second
)

// syncBackoffMultiplier is how much the wait grows after each failed or
// duplicate server dial (upstream: x1.5).
const syncBackoffMultiplier = 1.5

// syncBackoffJitter is the randomisation factor of the wait after a failed
// dial: each wait is drawn from [w*(1-j), w*(1+j)] and then capped at
// SyncIntervalCap, so that agents started together do not dial in step.
const syncBackoffJitter = 0.2

// Config configures a [ClientSet]. A zero duration means its default;
// [DefaultConfig] returns a Config with every default filled in.
type Config struct {
	// AgentID is sent as the agentID header on every stream. Required.
	AgentID string
	// Identifiers are sent as the agentIdentifiers header when non-empty.
	Identifiers wire.Identifiers
	// ServerAddress is the host:port of the proxy-servers' agent port,
	// usually a load balancer in front of them. Required.
	ServerAddress string
	// DialOptions are used for every server connection: transport
	// credentials (TLS) and keepalive, built by the caller. Without
	// transport credentials in them, set Insecure.
	DialOptions []grpc.DialOption
	// Insecure adds plaintext transport credentials to DialOptions,
	// overriding any given there. For local use only.
	Insecure bool
	// TokenPath names a file holding a bearer token, re-read on every
	// server dial and sent as "authorization: Bearer <token>". Empty means
	// no Authorization header.
	TokenPath string
	// Counter counts the servers. It is read once per sync round, and
	// that one Result gives both the count TargetPolicy weighs and, in
	// DialResolved mode, the addresses to dial (Result.Endpoints), so the
	// two always agree. A Counter that is a servercounter.Refresher is
	// asked to count again when a server the agent held goes away or a
	// dial to an address it listed fails. It should answer at once, as a
	// servercounter.CachedServerCounter does; a failed read keeps the last
	// result. Nil means servercounter.StaticServerCounter(1). A Counter
	// that is also a servercounter.Notifier, as a CachedServerCounter is,
	// wakes the sync loop as soon as its count changes rather than at the
	// next round.
	Counter servercounter.Counter
	// TargetPolicy says how the Counter's count and the counts servers
	// send combine. The zero value, TargetReceived, is upstream's
	// behaviour.
	TargetPolicy TargetPolicy
	// SyncInterval is the wait between sync rounds and the first wait
	// after a failed dial; default 1s.
	SyncInterval time.Duration
	// SyncIntervalCap caps the wait after repeated failed dials; default
	// 10s.
	SyncIntervalCap time.Duration
	// ProbeInterval is how often server connections are checked and dead
	// ones dropped; default 1s. With heartbeats on they are checked at
	// least every quarter of the Heartbeat interval.
	ProbeInterval time.Duration
	// SyncForever keeps opening a Connect stream every SyncInterval even
	// when the target is reached, as upstream's --sync-forever does to
	// learn counts. The new streams to known servers are closed at once.
	SyncForever bool
	// DialTimeout bounds one endpoint dial; default 5s.
	DialTimeout time.Duration
	// EndpointWriteTimeout bounds one write to an endpoint, and, with a
	// server without flow control, the wait of the stream's receive loop
	// for room in one tunnel's queue; when it passes the tunnel is closed.
	// Default DefaultEndpointWriteTimeout.
	EndpointWriteTimeout time.Duration
	// MaxConcurrentDials bounds the endpoint dials in flight, across every
	// server stream: a DIAL_REQ over it is refused at once with a DIAL_RSP
	// error, before any goroutine or socket. Default
	// DefaultMaxConcurrentDials.
	MaxConcurrentDials int
	// MaxTunnelsPerServer bounds the tunnels open on one server stream,
	// dials in flight included: a DIAL_REQ over it is refused at once with
	// a DIAL_RSP error. Default DefaultMaxTunnelsPerServer.
	MaxTunnelsPerServer int
	// HandshakeTimeout bounds one server dial, until the server's response
	// headers arrive; default 30s.
	HandshakeTimeout time.Duration
	// TunnelWindow is the flow-control window per tunnel, in bytes, that
	// the agent offers servers (wire.HeaderTunnelWindow); 0 means
	// wire.DefaultTunnelWindow. A server that answers with its own window
	// turns flow control on for the stream: a tunnel whose endpoint or
	// frontend does not read then holds up only itself, never the
	// stream's other tunnels. -1 turns it off, and the agent speaks
	// upstream's protocol exactly.
	TunnelWindow int
	// StreamStallTimeout is the liveness backstop: a server stream on
	// which nothing has moved, in or out, for this long while packets
	// wait to be sent, or whose receive loop has been inside one packet
	// for this long, is ended and dialled again, logged and counted in
	// servercount_agent_streams_ended_total{reason="stalled" or
	// "receive_stuck"}. Default DefaultStreamStallTimeout; a negative
	// value turns it off.
	StreamStallTimeout time.Duration
	// Heartbeat is the interval the agent offers servers
	// (wire.HeaderHeartbeat): on a stream whose server answers in kind
	// (servercount's), each end sends HEARTBEAT when it has sent nothing
	// else for its interval (the agent answers the server's when it has
	// sent nothing for half of its own, and sends one unprompted after
	// one and a half), and a server from which nothing has arrived
	// for wire.SilenceLimit of its own interval is dead, whatever the
	// transport says: the stream is ended at once, stops counting as
	// held, and the replacement is dialled in the same round. Zero means
	// wire.DefaultHeartbeat; -1 turns heartbeats off. Upstream's servers
	// ignore the offer: against them the gRPC keepalive in DialOptions is
	// the liveness check.
	Heartbeat time.Duration
	// ReadyWhenAll makes Ready, and so /readyz, report whether the agent
	// holds every server it counts (the target): it fails once fewer have
	// been held for longer than ReadinessGracePeriod, and passes again
	// when all are. False is upstream's meaning: at least one server held.
	ReadyWhenAll bool
	// ReadinessGracePeriod is how long, with ReadyWhenAll, fewer servers
	// than the target may be held before the agent is not ready. Zero
	// means no grace.
	ReadinessGracePeriod time.Duration
	// Registerer receives the agent's metrics. Nil means they are not
	// registered.
	Registerer prometheus.Registerer

	// ReceivedWindow is how many received counts are remembered; the
	// largest is used, since during a rollout old and new servers report
	// different counts. Default DefaultReceivedWindow.
	ReceivedWindow int
	// HoldDown is how long a lower count must persist before the target
	// drops to it; zero means DefaultHoldDown, a negative value none (a
	// lower count applies at once). Increases apply at once.
	HoldDown time.Duration
	// ServerCountMax caps every count the target is taken from, whatever
	// the TargetPolicy: the serverCount headers servers send as well as
	// the Counter's count. Default DefaultServerCountMax.
	ServerCountMax int
	// DialMode says where to dial servers; default DialLoadBalancer. In
	// DialResolved mode, a result that lists no address (a static count,
	// a cache's fallback) makes the agent dial ServerAddress; an address
	// without a port there takes ServerAddress's.
	DialMode DialMode
	// Clock times the hold-down and the outage logs' reminders; nil means
	// the real clock.
	Clock clock.Clock
}

// DefaultConfig returns a Config with every default set. AgentID and
// ServerAddress, and DialOptions or Insecure, are left to the caller.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults returns cfg with every zero field that has a default set.
func (cfg Config) withDefaults() Config {
	if cfg.Counter == nil {
		cfg.Counter = servercounter.StaticServerCounter(1)
	}
	cfg.SyncInterval = cmp.Or(cfg.SyncInterval, DefaultSyncInterval)
	cfg.SyncIntervalCap = cmp.Or(cfg.SyncIntervalCap, DefaultSyncIntervalCap)
	cfg.ProbeInterval = cmp.Or(cfg.ProbeInterval, DefaultProbeInterval)
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, DefaultDialTimeout)
	cfg.HandshakeTimeout = cmp.Or(cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	cfg.EndpointWriteTimeout = cmp.Or(cfg.EndpointWriteTimeout, DefaultEndpointWriteTimeout)
	cfg.HoldDown = cmp.Or(cfg.HoldDown, DefaultHoldDown)
	cfg.StreamStallTimeout = cmp.Or(cfg.StreamStallTimeout, DefaultStreamStallTimeout)
	cfg.ReceivedWindow = cmp.Or(cfg.ReceivedWindow, DefaultReceivedWindow)
	cfg.ServerCountMax = cmp.Or(cfg.ServerCountMax, DefaultServerCountMax)
	cfg.MaxConcurrentDials = cmp.Or(cfg.MaxConcurrentDials, DefaultMaxConcurrentDials)
	cfg.MaxTunnelsPerServer = cmp.Or(cfg.MaxTunnelsPerServer, DefaultMaxTunnelsPerServer)
	cfg.DialMode = cmp.Or(cfg.DialMode, DialLoadBalancer)
	cfg.TunnelWindow = cmp.Or(cfg.TunnelWindow, wire.DefaultTunnelWindow)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, wire.DefaultHeartbeat)
	return cfg
}

// validate returns every problem of cfg (defaults already applied), joined.
func (cfg Config) validate() error {
	var errs []error
	if cfg.AgentID == "" {
		errs = append(errs, errors.New("AgentID is empty: set the agent's ID (--agent-id)"))
	}
	if cfg.ServerAddress == "" {
		errs = append(errs, errors.New("ServerAddress is empty: set the proxy-servers' host:port"))
	} else if _, port, err := net.SplitHostPort(cfg.ServerAddress); err != nil {
		errs = append(errs, fmt.Errorf("ServerAddress %q is not host:port: %w", cfg.ServerAddress, err))
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		errs = append(errs, fmt.Errorf("ServerAddress %q has no numeric port: give host:port, e.g. proxy-server:8091", cfg.ServerAddress))
	}
	if len(cfg.DialOptions) == 0 && !cfg.Insecure {
		errs = append(errs, errors.New("DialOptions is empty and Insecure is false: give transport credentials (TLS), or set Insecure for plaintext local use"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SyncInterval", cfg.SyncInterval},
		{"SyncIntervalCap", cfg.SyncIntervalCap},
		{"ProbeInterval", cfg.ProbeInterval},
		{"DialTimeout", cfg.DialTimeout},
		{"HandshakeTimeout", cfg.HandshakeTimeout},
		{"EndpointWriteTimeout", cfg.EndpointWriteTimeout},
		{"ReadinessGracePeriod", cfg.ReadinessGracePeriod},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s is %v: want a positive duration, or 0 for the default", d.name, d.v))
		}
	}
	if cfg.SyncInterval > 0 && cfg.SyncIntervalCap > 0 && cfg.SyncIntervalCap < cfg.SyncInterval {
		errs = append(errs, fmt.Errorf("SyncIntervalCap %v is less than SyncInterval %v: want a cap at least the interval", cfg.SyncIntervalCap, cfg.SyncInterval))
	}
	if cfg.TargetPolicy < TargetReceived || cfg.TargetPolicy > TargetMax {
		errs = append(errs, fmt.Errorf("TargetPolicy is %v: use TargetReceived, TargetCounted or TargetMax", cfg.TargetPolicy))
	}
	if !cfg.DialMode.valid() {
		errs = append(errs, fmt.Errorf("DialMode is %q: use DialLoadBalancer or DialResolved", cfg.DialMode))
	}
	if cfg.ReceivedWindow < 0 {
		errs = append(errs, fmt.Errorf("ReceivedWindow is %d: want a positive number, or 0 for the default", cfg.ReceivedWindow))
	}
	if err := wire.CheckTunnelWindow(cfg.TunnelWindow); err != nil {
		errs = append(errs, fmt.Errorf("TunnelWindow %w (0 means the default)", err))
	}
	if err := wire.CheckHeartbeat(cfg.Heartbeat); err != nil {
		errs = append(errs, fmt.Errorf("Config.Heartbeat %w (0 means the default)", err))
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"ServerCountMax", cfg.ServerCountMax},
		{"MaxConcurrentDials", cfg.MaxConcurrentDials},
		{"MaxTunnelsPerServer", cfg.MaxTunnelsPerServer},
	} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s is %d: want a positive number, or 0 for the default", n.name, n.v))
		}
	}
	return errors.Join(errs...)
}
