package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/pkg/wire"
)

// The server's metrics. Under konnectivity_network_proxy_server_ they are
// upstream's: name, type, labels, HELP and buckets, and a labelled series
// appears when it first happens, as upstream's do. Ours are under
// servercount_server_ and end in _total where they count. docs/metrics.md
// lists them all, with their type, labels and HELP: it is generated from
// this code, so a table kept here would only drift from it.
var (
	upstream = metric.Prefix{Namespace: "konnectivity_network_proxy", Subsystem: "server"}
	ours     = metric.Prefix{Namespace: "servercount", Subsystem: "server"}
)

// dialFailureReason is the reason label of the dial failure counter.
type dialFailureReason string

// The dial failure reasons: upstream's label values, so that dashboards
// and alerts written for upstream's server match.
const (
	// dialFailureNoAgent: no strategy found an agent.
	dialFailureNoAgent dialFailureReason = "no_agent"
	// dialFailureErrorResponse: the agent answered DIAL_RSP with an
	// error.
	dialFailureErrorResponse dialFailureReason = "error_response"
	// dialFailureUnrecognizedResponse: the agent answered a dial that was
	// not pending (it had timed out, or the frontend had gone).
	dialFailureUnrecognizedResponse dialFailureReason = "unrecognized_response"
	// dialFailureBackendDialTimeout: no DIAL_RSP within
	// Config.BackendDialTimeout.
	dialFailureBackendDialTimeout dialFailureReason = "backend_dial_timeout"
	// dialFailureBackendClose: the agent stream ended before it answered.
	dialFailureBackendClose dialFailureReason = "backend_close"
	// dialFailureFrontendClose: the frontend gave up (DIAL_CLS, or its
	// stream or connection ended) before the agent answered.
	dialFailureFrontendClose dialFailureReason = "frontend_close"
)

// String returns the label value.
func (r dialFailureReason) String() string { return string(r) }

// rejectReason is the reason label of the agent rejection counter.
type rejectReason string

// The agent rejection reasons.
const (
	// rejectInvalidMetadata: agentID missing or repeated, or bad
	// agentIdentifiers.
	rejectInvalidMetadata rejectReason = "invalid_metadata"
	// rejectUnauthenticated: the bearer token is missing, malformed or not
	// accepted.
	rejectUnauthenticated rejectReason = "unauthenticated"
	// rejectShuttingDown: the server was closing.
	rejectShuttingDown rejectReason = "shutting_down"
	// rejectTooManyHandshakes: Config.MaxHandshakesPerAddress handshakes from
	// the peer's address, or MaxHandshakes in all, were in progress.
	rejectTooManyHandshakes rejectReason = "too_many_handshakes"
	// rejectTooManyStreams: the agent held MaxStreamsPerAgent streams.
	rejectTooManyStreams rejectReason = "too_many_streams"
	// rejectTooManyRefused: the peer's address had too many tokens
	// refused of late; its token was not checked.
	rejectTooManyRefused rejectReason = "too_many_refused_tokens"
	// rejectTooManyBytes: a connection sent more than MaxPreAuthBytes
	// before any of its streams was admitted, and was closed with all
	// its streams (counted once per connection).
	rejectTooManyBytes rejectReason = "too_many_bytes_before_auth"
	// rejectTooManyCut: the peer's address had a connection closed for
	// rejectTooManyBytes of late; its token was not checked. Also a
	// connection from an address that had too many closed so, closed at
	// once before its TLS handshake (counted once per connection).
	rejectTooManyCut rejectReason = "too_many_cut_connections"
)

var rejectReasons = []rejectReason{rejectInvalidMetadata, rejectUnauthenticated, rejectShuttingDown, rejectTooManyHandshakes, rejectTooManyStreams, rejectTooManyRefused, rejectTooManyBytes, rejectTooManyCut}

// String returns the label value.
func (r rejectReason) String() string { return string(r) }

// streamEndedReason is the reason label of the streams ended counter.
type streamEndedReason string

// The reasons the server ends a stream that is stuck.
const (
	// streamEndedStalled: nothing moved on an agent stream for
	// Config.StreamStallTimeout while packets waited to be sent.
	streamEndedStalled streamEndedReason = "stalled"
	// streamEndedControlBacklog: the peer left more control packets
	// unread than a stream may queue.
	streamEndedControlBacklog streamEndedReason = "control_backlog"
	// streamEndedSilent: an agent with heartbeats on sent nothing, not
	// even a heartbeat, for wire.SilenceLimit of its interval.
	streamEndedSilent streamEndedReason = "silent"
	// streamEndedReceiveStuck: the stream's receive loop was inside one
	// packet for Config.StreamStallTimeout.
	streamEndedReceiveStuck streamEndedReason = "receive_stuck"
	// streamEndedUnresponsive: the agent answered none of its dials for
	// Config.StreamStallTimeout.
	streamEndedUnresponsive streamEndedReason = "unresponsive"
)

var streamEndedReasons = []streamEndedReason{streamEndedStalled, streamEndedControlBacklog, streamEndedSilent, streamEndedReceiveStuck, streamEndedUnresponsive}

// retryReason is the reason label of the dial retries counter.
type retryReason string

// Why a pending dial was sent to another agent.
const (
	// retryUnresponsive: its agent sent nothing for
	// Config.UnansweredDialTimeout after the dial, or left
	// unresponsiveTimeouts dials in a row unanswered.
	retryUnresponsive retryReason = "unresponsive"
	// retryTimeout: its agent did not answer within
	// Config.BackendDialTimeout.
	retryTimeout retryReason = "timeout"
)

var retryReasons = []retryReason{retryUnresponsive, retryTimeout}

// tunnelEndedReason is the reason label of the tunnels ended counter.
type tunnelEndedReason string

// The reasons the server ends a tunnel that is stuck.
const (
	// tunnelEndedNoCredit: a gRPC frontend's data for the tunnel waited
	// Config.FrontendWriteTimeout for the agent's flow-control credit.
	tunnelEndedNoCredit tunnelEndedReason = "no_credit"
)

var tunnelEndedReasons = []tunnelEndedReason{tunnelEndedNoCredit}

// serviceMethod is the service_method label of the gRPC connections gauge.
type serviceMethod string

// Upstream's values: the method's name alone.
const (
	methodAgentConnect serviceMethod = "Connect"
	methodProxy        serviceMethod = "Proxy"
)

// metrics holds the server's collectors behind typed methods. Its fields
// are set once in newMetrics; the collectors are safe for concurrent use.
type metrics struct {
	backends        prometheus.Gauge
	grpcConns       *prometheus.GaugeVec
	httpConns       prometheus.Gauge
	pendingDials    prometheus.Gauge
	established     prometheus.Gauge
	dialFailures    *prometheus.CounterVec
	reportedCount   prometheus.Gauge
	agentRejection  *prometheus.CounterVec
	preAuthConns    prometheus.Gauge
	waitingForAgent prometheus.Gauge
	waitingForFe    prometheus.Gauge
	duplicateDials  prometheus.Counter
	queuedBytes     prometheus.Gauge
	controlQueued   prometheus.Gauge
	streamsEnded    *prometheus.CounterVec
	tunnelsEnded    *prometheus.CounterVec
	unresponsive    prometheus.Gauge
	dialRetries     *prometheus.CounterVec
	contested       prometheus.Counter
	unbound         prometheus.Counter

	readyBackends *prometheus.GaugeVec
	dialDuration  prometheus.Histogram
	feWrite       prometheus.Histogram
	connDuration  prometheus.Histogram
	fullReceive   *prometheus.GaugeVec
	streamPackets *prometheus.CounterVec
	streamErrors  *prometheus.CounterVec
	// packets caches streamPackets' children by packetKey: the vector
	// hashes and checks its label values on every call, and packet is
	// called for every packet, heartbeats of thousands of idle agents
	// among them.
	packets sync.Map
}

// packetKey names a child of stream_packets_total.
type packetKey struct {
	segment string
	typ     client.PacketType
}

// Segments of a packet's way, as upstream labels them.
const (
	segmentFromAgent  = "from_agent"
	segmentToAgent    = "to_agent"
	segmentFromClient = "from_client"
	segmentToClient   = "to_client"
)

// Upstream's histogram buckets.
var (
	latencyBuckets            = []float64{0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5}
	connectionDurationBuckets = []float64{1, 5, 15, 30, 60, 300, 900, 1800, 3600, 14400, 43200, 86400}
)

// newMetrics builds the collectors and registers them on reg, if not nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		backends: upstream.Gauge("ready_backend_connections",
			"Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends"),
		grpcConns: upstream.GaugeVec("grpc_connections",
			"Number of current grpc connections, partitioned by service method.", "service_method"),
		httpConns: upstream.Gauge("http_connections",
			"Number of current HTTP CONNECT connections"),
		pendingDials: upstream.Gauge("pending_backend_dials",
			"Current number of pending backend dial requests"),
		established: upstream.Gauge("established_connections",
			"Current number of established end-to-end connections (post-dial)."),
		dialFailures: upstream.CounterVec("dial_failure_count",
			"Number of dial failures observed. Multiple failures can occur for a single dial request.", "reason"),
		reportedCount: ours.Gauge("reported_server_count",
			"The server count last sent to an agent in the serverCount header."),
		agentRejection: ours.CounterVec("agent_rejections_total",
			"Number of agent streams refused at the handshake, by reason; too_many_bytes_before_auth counts agent connections closed for sending more than 64 KiB before any of their streams was admitted, and too_many_cut_connections handshakes refused without a check, and connections closed before their TLS handshake, because their address had such connections of late.", "reason"),
		preAuthConns: ours.Gauge("agent_connections_unauthenticated",
			"Agent connections none of whose streams has been admitted yet: each may make the server read at most 64 KiB until one is."),
		waitingForAgent: ours.Gauge("frontends_waiting_for_agent",
			"Number of frontends (gRPC streams and HTTP CONNECT tunnels) whose next packet waits for room in an agent stream's send queue: an agent that does not read holds them."),
		waitingForFe: ours.Gauge("deliveries_waiting_for_frontend",
			"Number of packets for gRPC frontends waiting for room in a frontend's send queue, each for at most --frontend-write-timeout: a frontend that does not read holds them. Never an agent stream's receive loop with flow control on."),
		duplicateDials: ours.Counter("duplicate_dials_total",
			"Number of dials refused as duplicates: a frontend reused the random of a pending dial, or an agent answered with a connectID the frontend already uses."),
		queuedBytes: ours.Gauge("queued_bytes",
			"Bytes of DATA queued for agents and frontends and not yet sent, across every stream and HTTP CONNECT tunnel; at most 33 x 32 KiB per queue."),
		controlQueued: ours.Gauge("control_queued_packets",
			"Control packets (CLOSE_REQ, CLOSE_RSP, DIAL_RSP errors) that receive loops queued without waiting and that are not yet sent, across every stream; at most 4096 per stream beyond those about its own tunnels and dials, and 65536 of those."),
		streamsEnded: ours.CounterVec("streams_ended_total",
			"Number of streams the server ended because they were stuck or their agent dead, by reason: stalled (nothing moved while packets waited), control_backlog (the peer left too many control packets unread), silent (the agent sent nothing, not even a heartbeat, for 2.5 of its heartbeat intervals), receive_stuck (the receive loop was inside one packet for --stream-stall-timeout), unresponsive (the agent answered no dial for --stream-stall-timeout).", "reason"),
		unresponsive: ours.Gauge("unresponsive_agent_streams",
			"Agent streams taken for unresponsive: a dial waited --unanswered-dial-timeout with nothing from the agent since, or several dials in a row timed out. They get new dials only when no other agent can take them; at most half the agent streams are."),
		dialRetries: ours.CounterVec("dial_retries_total",
			"Number of pending dials sent again to another agent, by reason: unresponsive (their agent was taken for unresponsive), timeout (their agent did not answer within --backend-dial-timeout). A dial is retried once at most.", "reason"),
		contested: ours.Counter("contested_identifier_claims_total",
			"Number of host, ipv4 and ipv6 identifiers that agent streams claimed while a stream of another agent held them: with destHost the first to claim a host gets its dials while it is connected, and a later claimant none."),
		unbound: ours.Counter("unbound_identifier_claims_total",
			"Number of host, ipv4 and ipv6 identifiers that agent streams claimed and their credential does not prove, dropped with --bind-agent-identifiers: the agent gets none of their dials."),
		tunnelsEnded: ours.CounterVec("tunnels_ended_total",
			"Number of tunnels the server ended because they were stuck, by reason: no_credit (a frontend's data waited too long for the agent's flow-control credit).", "reason"),
		readyBackends: upstream.GaugeVec("ready_backends",
			"Number of konnectivity agent connected to the proxy server", "proxy_strategy"),
		dialDuration: upstream.Histogram("dial_duration_seconds",
			"Latency of dial to the remote endpoint in seconds", latencyBuckets),
		feWrite: upstream.Histogram("frontend_write_duration_seconds",
			"Latency of write to the frontend in seconds", latencyBuckets),
		connDuration: upstream.Histogram("connection_duration_seconds",
			"Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.", connectionDurationBuckets),
		fullReceive: upstream.GaugeVec("full_receive_channels",
			"Number of current connections blocked by a full receive channel, partitioned by service method.", "service_method"),
		streamPackets: upstream.CounterVec("stream_packets_total",
			"Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)", "segment", "packet_type"),
		streamErrors: upstream.CounterVec("stream_errors_total",
			"Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)", "segment", "code", "packet_type"),
	}
	// Our own labelled series exist at 0 from the start, so that alerts
	// see zeros; upstream's appear when they first happen, as upstream's
	// do, so that tools comparing the two see the same series.
	for _, r := range rejectReasons {
		m.agentRejection.WithLabelValues(string(r))
	}
	for _, r := range streamEndedReasons {
		m.streamsEnded.WithLabelValues(string(r))
	}
	for _, r := range tunnelEndedReasons {
		m.tunnelsEnded.WithLabelValues(string(r))
	}
	for _, r := range retryReasons {
		m.dialRetries.WithLabelValues(string(r))
	}
	if err := metric.Register(reg, "proxy-server metrics (is another Server registered on the same registry?)",
		m.backends, m.grpcConns, m.httpConns, m.pendingDials, m.established, m.dialFailures, m.reportedCount, m.agentRejection, m.preAuthConns, m.waitingForAgent, m.waitingForFe, m.duplicateDials, m.queuedBytes,
		m.controlQueued, m.streamsEnded, m.tunnelsEnded, m.unresponsive, m.dialRetries, m.contested, m.unbound,
		m.readyBackends, m.dialDuration, m.feWrite, m.connDuration, m.fullReceive, m.streamPackets, m.streamErrors); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) addBackends(n int) { m.backends.Add(float64(n)) }
func (m *metrics) addGRPCConns(sm serviceMethod, n int) {
	m.grpcConns.WithLabelValues(string(sm)).Add(float64(n))
}
func (m *metrics) addHTTPConns(n int)    { m.httpConns.Add(float64(n)) }
func (m *metrics) addPendingDials(n int) { m.pendingDials.Add(float64(n)) }
func (m *metrics) addEstablished(n int)  { m.established.Add(float64(n)) }
func (m *metrics) observeDialFailure(r dialFailureReason) {
	m.dialFailures.WithLabelValues(string(r)).Inc()
}
func (m *metrics) observeDuplicateDial()        { m.duplicateDials.Inc() }
func (m *metrics) setReportedServerCount(n int) { m.reportedCount.Set(float64(n)) }
func (m *metrics) observeAgentRejection(r rejectReason) {
	m.agentRejection.WithLabelValues(string(r)).Inc()
}
func (m *metrics) addPreAuthConns(n int) { m.preAuthConns.Add(float64(n)) }
func (m *metrics) addWaitingForAgent(n int) {
	m.waitingForAgent.Add(float64(n))
	m.fullReceive.WithLabelValues(string(methodProxy)).Add(float64(n))
}
func (m *metrics) addQueuedBytes(n int)   { m.queuedBytes.Add(float64(n)) }
func (m *metrics) addControlQueued(n int) { m.controlQueued.Add(float64(n)) }
func (m *metrics) observeStreamEnded(r streamEndedReason) {
	m.streamsEnded.WithLabelValues(string(r)).Inc()
}
func (m *metrics) addWaitingForFrontend(n int) { m.waitingForFe.Add(float64(n)) }
func (m *metrics) addUnresponsive(n int)       { m.unresponsive.Add(float64(n)) }
func (m *metrics) observeDialRetry(r retryReason) {
	m.dialRetries.WithLabelValues(string(r)).Inc()
}
func (m *metrics) observeContestedClaims(n int) { m.contested.Add(float64(n)) }
func (m *metrics) observeUnboundClaims(n int)   { m.unbound.Add(float64(n)) }
func (m *metrics) observeTunnelEnded(r tunnelEndedReason) {
	m.tunnelsEnded.WithLabelValues(string(r)).Inc()
}
func (m *metrics) addReadyBackend(st Strategy, n int) {
	m.readyBackends.WithLabelValues(string(st)).Add(float64(n))
}
func (m *metrics) observeDialDuration(d time.Duration)  { m.dialDuration.Observe(d.Seconds()) }
func (m *metrics) observeFrontendWrite(d time.Duration) { m.feWrite.Observe(d.Seconds()) }
func (m *metrics) observeConnection(d time.Duration)    { m.connDuration.Observe(d.Seconds()) }
func (m *metrics) packet(segment string, typ client.PacketType) {
	k := packetKey{segment, typ}
	if c, ok := m.packets.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	name := wire.PacketTypeName(typ)
	c := m.streamPackets.WithLabelValues(segment, name)
	if name != wire.PacketTypeUnknown {
		// Unknown types share one child and are not cached: a peer
		// sending every number would otherwise grow the cache without
		// bound.
		m.packets.Store(k, c)
	}
	c.Inc()
}

// streamError counts a failed send or receive on a gRPC stream; typ is
// the type of the packet sent, wire.PacketTypeNone for a receive.
func (m *metrics) streamError(segment string, err error, typ string) {
	m.streamErrors.WithLabelValues(segment, status.Code(err).String(), typ).Inc()
}
