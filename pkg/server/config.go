package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// Strategy names a way to choose an agent for a dial.
type Strategy string

// The strategies, as upstream's --proxy-strategies names them.
const (
	// StrategyDefault picks a random agent and uses its oldest stream. It
	// skips agents that sent DRAIN unless every agent is draining.
	StrategyDefault Strategy = "default"
	// StrategyDestHost picks the oldest stream among those whose host,
	// ipv4 or ipv6 identifiers name the dial's host (names without case,
	// addresses by value): the first agent to claim a host gets its dials
	// while it is connected, as upstream's server has it. A draining
	// stream, then an unresponsive one, gives way to the next.
	StrategyDestHost Strategy = "destHost"
	// StrategyDefaultRoute picks a random agent that advertised
	// default-route=true.
	StrategyDefaultRoute Strategy = "defaultRoute"
)

// String returns the strategy's name.
func (s Strategy) String() string { return string(s) }

var validStrategies = []Strategy{StrategyDefault, StrategyDestHost, StrategyDefaultRoute}

func (s Strategy) valid() bool {
	for _, v := range validStrategies {
		if s == v {
			return true
		}
	}
	return false
}

func validStrategyNames() string {
	names := make([]string, len(validStrategies))
	for i, v := range validStrategies {
		names[i] = string(v)
	}
	return strings.Join(names, ", ")
}

// ParseStrategies parses a comma-separated list of strategies such as
// "destHost,default", in the order they are to be tried. Spaces around
// names are ignored; an empty list, an empty name or an unknown name is an
// error that lists the valid names.
func ParseStrategies(s string) ([]Strategy, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty proxy strategy list: want a comma-separated list of %s", validStrategyNames())
	}
	var out []Strategy
	for _, name := range strings.Split(s, ",") {
		st := Strategy(strings.TrimSpace(name))
		if !st.valid() {
			return nil, fmt.Errorf("unknown proxy strategy %q in %q: valid strategies are %s", st, s, validStrategyNames())
		}
		out = append(out, st)
	}
	return out, nil
}

// DefaultFrontendWriteTimeout is how long a packet from an agent waits for
// room in a frontend's queue before the frontend is torn down. It matches
// the 10 s read timeout of the konnectivity-client library.
const DefaultFrontendWriteTimeout = 10 * time.Second

// DefaultBackendDialTimeout bounds the wait for an agent's DIAL_RSP:
// twice the 5 s that agents, upstream's and ours, take at most to answer
// a dial to an endpoint that does not answer, so that only an agent that
// does not answer at all reaches it. Upstream waits without limit.
const DefaultBackendDialTimeout = 10 * time.Second

// DefaultUnansweredDialTimeout is how long a dial may wait with nothing
// from its agent since before the agent is taken for unresponsive. A
// healthy agent answers a dial within milliseconds, or sends something
// else meanwhile: ours sends a HEARTBEAT with the dial's random when a
// dial is not answered within wire.DialProgress. An idle upstream agent dialing a slow endpoint can
// be taken for unresponsive for a while; that costs the dial a second
// agent, and nothing more.
const DefaultUnansweredDialTimeout = 2 * time.Second

// backendDialTimeouts is how many backend dial timeouts in a row, with no
// DIAL_RSP between them, make an agent unresponsive.
const backendDialTimeouts = 3

// DefaultStreamStallTimeout is how long nothing may move on an agent
// stream while packets wait to be sent before the server ends it. It is
// well above every bounded wait of a healthy stream (the 10 s write
// timeouts of frontends and endpoints), so that only a stream that is
// truly stuck is ended.
const DefaultStreamStallTimeout = 30 * time.Second

// TokenAuthenticator checks an agent's bearer token.
type TokenAuthenticator interface {
	// AuthenticateToken returns nil if token may connect, else an error
	// saying why not (it is logged, never sent to the agent).
	AuthenticateToken(ctx context.Context, token string) error
}

// Config configures a [Server]. The zero value of each field but ServerID
// means its default.
type Config struct {
	// ServerID identifies this server to agents (the serverID header).
	// Required.
	ServerID string
	// Counter is read on every agent handshake for the serverCount header.
	// Nil means servercounter.StaticServerCounter(1).
	Counter servercounter.ServerCounter
	// Strategies are tried in order to choose an agent for a dial; the
	// first that finds one wins. Nil means [StrategyDefault] alone.
	Strategies []Strategy
	// Authenticator, if set, checks the bearer token every agent must send
	// in the authorization header. Nil means no token authentication (TLS
	// client certificates are checked by the gRPC server's credentials,
	// outside this package).
	Authenticator TokenAuthenticator
	// BackendDialTimeout bounds the wait for an agent's DIAL_RSP. When
	// it passes, the dial is sent to another agent if the strategy that
	// chose the first finds one and the dial was not sent again already;
	// else the frontend gets DIAL_RSP{error "timed out waiting for
	// backend dial"}. Zero means [DefaultBackendDialTimeout]; a negative
	// value means no limit (upstream's default).
	BackendDialTimeout time.Duration
	// UnansweredDialTimeout is how long a dial may wait with nothing
	// received from its agent since it was sent but plain HEARTBEATs
	// (which an agent that reads nothing still sends; our agent's
	// dial-progress HEARTBEAT, wire.DialProgressHeartbeat, counts) before
	// the agent is taken for unresponsive: a stopped process, a lock-up, a
	// path that delivers nothing, a deaf agent. Its pending dials are sent to other agents (once
	// each, by the strategy that chose it), it gets new dials only when
	// no other agent can take them, and if it stays so for
	// StreamStallTimeout its stream is ended. At most half the agent
	// streams are taken for unresponsive at once, and a stream whose
	// agent is the last to serve one of its destHost identifiers is not
	// ended. An agent that answers a dial is responsive again.
	// backendDialTimeouts timeouts in a row do the same for an agent that
	// sends something but answers no dial. Zero means
	// [DefaultUnansweredDialTimeout]; a negative value turns it off.
	UnansweredDialTimeout time.Duration
	// Heartbeat is the interval the server answers an agent's heartbeat
	// offer with (wire.HeaderHeartbeat): on a stream whose agent offers
	// one (servercount's), each end sends HEARTBEAT when it has sent
	// nothing else for its interval (the agent answers the server's: see
	// wire.HeaderHeartbeat), and an agent from which nothing has
	// arrived for wire.SilenceLimit of its own interval is dead: its
	// stream is ended, its pending dials fail, and its tunnels close.
	// Zero means wire.DefaultHeartbeat; -1 turns heartbeats off.
	// Upstream's agents do not offer: against them the gRPC keepalive
	// the caller sets is the liveness check.
	Heartbeat time.Duration
	// FrontendWriteTimeout bounds the wait for room in a slow frontend's
	// queue (see the package doc). Zero means
	// [DefaultFrontendWriteTimeout].
	FrontendWriteTimeout time.Duration
	// TunnelWindow is the flow-control window per tunnel, in bytes, that
	// the server grants an agent offering one (wire.HeaderTunnelWindow);
	// 0 means wire.DefaultTunnelWindow. With flow control a frontend that
	// does not read holds up only its own tunnel, never the agent stream
	// it shares. -1 turns it off: the server then speaks upstream's
	// protocol exactly, whatever the agent offers.
	TunnelWindow int
	// StreamStallTimeout is the liveness backstop: an agent stream on
	// which nothing has moved, in or out, for this long while packets
	// wait to be sent is ended (the agent dials again), logged and
	// counted in servercount_server_streams_ended_total{reason="stalled"}.
	// Zero means [DefaultStreamStallTimeout]; a negative value turns it
	// off.
	StreamStallTimeout time.Duration
	// BindIdentifiers lets an agent claim, in its agentIdentifiers, only
	// the hosts and addresses its credential proves: with an
	// Authenticator, the node a service-account token is bound to (it
	// must be a [TokenIdentifier]); without, the DNS and IP SANs of its
	// client certificate. Any other host, ipv4 or ipv6 claim is dropped,
	// logged and counted (servercount_server_unbound_identifier_claims_total);
	// the agent still serves the default strategy. Upstream takes every
	// claim as sent.
	BindIdentifiers bool
	// MaxHandshakesPerAddress bounds the agent handshakes whose token is
	// in review from one IP address (an IPv6 /64): a flood from one
	// address cannot fill the review queue that every agent shares.
	// Handshakes beyond it are refused at once and the agents try again.
	// An address whose tokens were refused 10 times, and then more than
	// once a second, is refused without a check until it slows down.
	// Zero means [DefaultMaxHandshakesPerAddress]; a negative value
	// leaves only the bound in all ([MaxHandshakes]), and none on
	// refusals, for agents that reach the server through one SNAT
	// address.
	MaxHandshakesPerAddress int
	// Clock tells the time of the per-address buckets of refused tokens
	// and of connections cut before they authenticated (see
	// MaxHandshakesPerAddress and [Server.AgentListener]), so that a test
	// can hold it still; nil means [clock.Real]. Liveness is timed on the
	// monotonic clock.
	Clock clock.Clock
	// Logger receives the server's logs, named "proxy-server". The zero
	// value is klog's global logger.
	Logger klog.Logger
	// Registerer receives the server's metrics. Nil means they are not
	// registered anywhere.
	Registerer prometheus.Registerer
}

// withDefaults validates cfg and fills in its defaults, returning every
// problem at once.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	if cfg.ServerID == "" {
		errs = append(errs, errors.New("server ID is empty: set it to a name unique among the proxy-servers (upstream --server-id)"))
	}
	if cfg.Counter == nil {
		cfg.Counter = servercounter.StaticServerCounter(1)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Strategies == nil {
		cfg.Strategies = []Strategy{StrategyDefault}
	} else if len(cfg.Strategies) == 0 {
		errs = append(errs, fmt.Errorf("empty proxy strategy list: want one or more of %s", validStrategyNames()))
	}
	for _, st := range cfg.Strategies {
		if !st.valid() {
			errs = append(errs, fmt.Errorf("unknown proxy strategy %q: valid strategies are %s", st, validStrategyNames()))
		}
	}
	cfg.BackendDialTimeout = cmp.Or(cfg.BackendDialTimeout, DefaultBackendDialTimeout)
	cfg.UnansweredDialTimeout = cmp.Or(cfg.UnansweredDialTimeout, DefaultUnansweredDialTimeout)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, wire.DefaultHeartbeat)
	if err := wire.CheckHeartbeat(cfg.Heartbeat); err != nil {
		errs = append(errs, fmt.Errorf("heartbeat %w (0 means the default)", err))
	}
	if cfg.FrontendWriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("frontend write timeout %v is negative: use 0 for the default %v", cfg.FrontendWriteTimeout, DefaultFrontendWriteTimeout))
	}
	cfg.FrontendWriteTimeout = cmp.Or(cfg.FrontendWriteTimeout, DefaultFrontendWriteTimeout)
	cfg.StreamStallTimeout = cmp.Or(cfg.StreamStallTimeout, DefaultStreamStallTimeout)
	if _, ok := cfg.Authenticator.(TokenIdentifier); cfg.BindIdentifiers && cfg.Authenticator != nil && !ok {
		errs = append(errs, errCannotIdentify)
	}
	cfg.MaxHandshakesPerAddress = cmp.Or(cfg.MaxHandshakesPerAddress, DefaultMaxHandshakesPerAddress)
	cfg.TunnelWindow = cmp.Or(cfg.TunnelWindow, wire.DefaultTunnelWindow)
	if err := wire.CheckTunnelWindow(cfg.TunnelWindow); err != nil {
		errs = append(errs, fmt.Errorf("tunnel window %w (0 means the default)", err))
	}
	return cfg, errors.Join(errs...)
}

// sweepPeriods are how often the liveness sweep (liveness.sweep) runs its
// checks: often enough for each to act within a fifth of its interval or
// a quarter of its timeout, and at least every second. answer is the
// period of the unanswered-dial checks, streams that of the others, a
// whole number of answer periods (the sweep's tick).
func (cfg Config) sweepPeriods() (answer, streams time.Duration) {
	period := func(ds ...time.Duration) time.Duration {
		p := time.Second
		for _, d := range ds {
			if d > 0 {
				p = min(p, d)
			}
		}
		return max(p, wire.MinHeartbeat/5)
	}
	streams = period(cfg.Heartbeat/5, cfg.StreamStallTimeout/4)
	answer = period(cfg.UnansweredDialTimeout/4, streams)
	return answer, streams.Truncate(answer)
}
