package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/pkg/wire"
)

// The agent's metrics. Names under konnectivity_network_proxy_agent_ keep
// upstream's name and meaning, so that dashboards and tools written for
// the upstream agent work; our own are under servercount_agent_.
// docs/metrics.md lists them all, with their type, labels and HELP: it is
// generated from this code, so a table kept here would only drift from it.
var (
	upstream = metric.Prefix{Namespace: "konnectivity_network_proxy", Subsystem: "agent"}
	ours     = metric.Prefix{Namespace: "servercount", Subsystem: "agent"}
)

// dialFailureReason labels endpoint_dial_failure_total.
type dialFailureReason string

// Reasons for a failed endpoint dial, as upstream names them.
const (
	dialFailureTimeout dialFailureReason = "timeout"
	dialFailureUnknown dialFailureReason = "unknown"
	// dialFailureDialLimit: refused, MaxConcurrentDials dials were in
	// flight. Ours: upstream has no bound.
	dialFailureDialLimit dialFailureReason = "dial_limit"
	// dialFailureTunnelLimit: refused, the server stream had
	// MaxTunnelsPerServer tunnels open. Ours: upstream has no bound.
	dialFailureTunnelLimit dialFailureReason = "tunnel_limit"
)

// dialResult labels server_dials_total.
type dialResult string

// Outcomes of one server dial.
const (
	// dialOK: a new server was added.
	dialOK dialResult = "ok"
	// dialDuplicate: the server was already connected; the new stream was
	// closed.
	dialDuplicate dialResult = "duplicate"
	// dialError: no stream, or a handshake that broke the protocol.
	dialError dialResult = "error"
)

// streamEndedReason labels streams_ended_total.
type streamEndedReason string

// The reasons the agent ends a server stream that is stuck.
const (
	// streamEndedStalled: nothing moved on the stream for
	// StreamStallTimeout while packets waited to be sent.
	streamEndedStalled streamEndedReason = "stalled"
	// streamEndedControlBacklog: the server left maxControl answers
	// unread.
	streamEndedControlBacklog streamEndedReason = "control_backlog"
	// streamEndedSilent: the server sent nothing, not even a heartbeat,
	// for wire.SilenceLimit of its heartbeat interval.
	streamEndedSilent streamEndedReason = "silent"
	// streamEndedReceiveStuck: the receive loop was inside one packet for
	// StreamStallTimeout.
	streamEndedReceiveStuck streamEndedReason = "receive_stuck"
)

// metrics holds the agent's collectors. It is safe for concurrent use.
type metrics struct {
	openServerConns   prometheus.Gauge
	knownServerCount  prometheus.Gauge
	endpointDialFails *prometheus.CounterVec
	openEndpointConns prometheus.Gauge
	serverDials       *prometheus.CounterVec
	targetCount       *prometheus.GaugeVec
	syncRounds        prometheus.Counter
	dialsInFlight     prometheus.Gauge
	busiestServer     prometheus.GaugeFunc
	dialDuration      prometheus.Histogram
	streamPackets     *prometheus.CounterVec
	streamErrors      *prometheus.CounterVec
	connFailures      *prometheus.CounterVec
	queuedBytes       prometheus.Gauge
	controlQueued     prometheus.Gauge
	streamsEnded      *prometheus.CounterVec
	ready             prometheus.GaugeFunc
	missing           prometheus.GaugeFunc
}

// segment is a packet's way between agent and server: upstream's
// segment label values, named from the server's side (from_agent is what
// the agent sends), and the deprecated failure counter's direction
// label, named from the agent's.
type segment struct{ name, direction string }

var (
	segmentSent     = segment{name: "from_agent", direction: "to_server"}
	segmentReceived = segment{name: "to_agent", direction: "from_server"}
)

// newMetrics builds the collectors and registers them on reg, unless reg
// is nil. busiest returns the tunnels of the busiest server stream, and
// readiness whether the agent is ready and how long it has served on
// fewer servers than its target, both read at each scrape.
func newMetrics(reg prometheus.Registerer, busiest func() float64, readiness func() (bool, time.Duration)) (*metrics, error) {
	m := &metrics{
		ready: ours.GaugeFunc("ready",
			"1 while the agent is ready, as /readyz answers: it holds a server and, with --readiness-all-servers, it has not held fewer than it counts for longer than --readiness-grace-period.", func() float64 {
				if ok, _ := readiness(); ok {
					return 1
				}
				return 0
			}),
		missing: ours.GaugeFunc("missing_servers_seconds",
			"How long the agent has served on fewer proxy-servers than it aims for (target_server_count); 0 while it serves on them all.", func() float64 {
				_, d := readiness()
				return d.Seconds()
			}),
		openServerConns: upstream.Gauge("open_server_connections",
			"Current number of open server connections."),
		knownServerCount: upstream.Gauge("known_server_count",
			"Current number of servers agent is trying to connect to."),
		endpointDialFails: upstream.CounterVec("endpoint_dial_failure_total",
			"Number of failures dialing the remote endpoint, by reason (example: timeout).", "reason"),
		openEndpointConns: upstream.Gauge("open_endpoint_connections",
			"Current number of open endpoint connections."),
		serverDials: ours.CounterVec("server_dials_total",
			"Number of Connect streams opened to proxy-servers, by result (ok, duplicate, error).", "result"),
		targetCount: ours.GaugeVec("target_server_count",
			"Server count the agent aims for, labelled by the source that decided it (static, dns, leases, fallback, received).", "source"),
		syncRounds: ours.Counter("sync_rounds_total",
			"Number of rounds of the agent's sync loop, whether it dialed or not."),
		dialsInFlight: ours.Gauge("endpoint_dials_in_flight",
			"Endpoint dials in flight, across every server stream; DIAL_REQs over --max-concurrent-dials are refused."),
		queuedBytes: ours.Gauge("queued_bytes",
			"Bytes received from servers and not yet written to their endpoints, across every tunnel; at most 128 x 32 KiB per tunnel."),
		controlQueued: ours.Gauge("control_queued_packets",
			"Answers (CLOSE_RSP, refused DIAL_RSP) queued without waiting and not yet sent, across every server stream; at most 4096 per stream beyond the CLOSE_RSPs of its own tunnels (which --max-tunnels-per-server bounds)."),
		streamsEnded: ours.CounterVec("streams_ended_total",
			"Number of server streams the agent ended because they were stuck or their server dead, by reason: stalled (nothing moved while packets waited), control_backlog (the server left too many answers unread), silent (the server sent nothing, not even a heartbeat, for 2.5 of its heartbeat intervals), receive_stuck (the receive loop was inside one packet for --stream-stall-timeout).", "reason"),
		busiestServer: ours.GaugeFunc("busiest_server_tunnels",
			"Tunnels, dials in flight included, on the server stream that has the most; DIAL_REQs over --max-tunnels-per-server are refused.", busiest),
		dialDuration: upstream.Histogram("dial_duration_seconds",
			"Latency of dial to the remote endpoint in seconds", []float64{0.005, 0.025, 0.1, 0.5, 2.5, 10, 30}),
		streamPackets: upstream.CounterVec("stream_packets_total",
			"Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)", "segment", "packet_type"),
		streamErrors: upstream.CounterVec("stream_errors_total",
			"Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)", "segment", "code", "packet_type"),
		connFailures: upstream.CounterVec("server_connection_failure_count",
			"Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total", "direction"),
	}
	// Our own labelled series exist at 0 from the start; upstream's
	// appear when they first happen, as upstream's do, so that tools
	// comparing the two see the same series.
	for _, r := range []dialResult{dialOK, dialDuplicate, dialError} {
		m.serverDials.WithLabelValues(string(r))
	}
	for _, r := range []streamEndedReason{streamEndedStalled, streamEndedControlBacklog, streamEndedSilent, streamEndedReceiveStuck} {
		m.streamsEnded.WithLabelValues(string(r))
	}
	if err := metric.Register(reg, "agent metrics (is a second ClientSet using the same Registerer?)",
		m.openServerConns, m.knownServerCount, m.endpointDialFails, m.openEndpointConns,
		m.serverDials, m.targetCount, m.syncRounds, m.dialsInFlight, m.busiestServer,
		m.dialDuration, m.streamPackets, m.streamErrors, m.connFailures, m.queuedBytes,
		m.controlQueued, m.streamsEnded, m.ready, m.missing); err != nil {
		return nil, err
	}
	return m, nil
}

// addQueuedBytes adds n (negative: subtracts) to the bytes queued for
// endpoints.
func (m *metrics) addQueuedBytes(n int) { m.queuedBytes.Add(float64(n)) }

// addControlQueued adds n (negative: subtracts) to the queued answers.
func (m *metrics) addControlQueued(n int) { m.controlQueued.Add(float64(n)) }

// streamEnded counts a server stream the agent ended as stuck.
func (m *metrics) streamEnded(r streamEndedReason) { m.streamsEnded.WithLabelValues(string(r)).Inc() }

// packet counts a packet sent to or received from a server.
func (m *metrics) packet(seg segment, typ pb.PacketType) {
	m.streamPackets.WithLabelValues(seg.name, wire.PacketTypeName(typ)).Inc()
}

// streamError counts a failed send or receive on a server stream; typ is
// the type of the packet sent, wire.PacketTypeNone for a receive.
func (m *metrics) streamError(seg segment, err error, typ string) {
	m.streamErrors.WithLabelValues(seg.name, status.Code(err).String(), typ).Inc()
	m.connFailures.WithLabelValues(seg.direction).Inc()
}

// setOpenServerConnections records the number of connected servers.
func (m *metrics) setOpenServerConnections(n int) { m.openServerConns.Set(float64(n)) }

// setTarget records the target and where it came from, keeping one series
// of target_server_count: the previous source's is deleted.
func (m *metrics) setTarget(n int, src, oldSrc string) {
	m.knownServerCount.Set(float64(n))
	if oldSrc != src {
		m.targetCount.DeleteLabelValues(oldSrc)
	}
	m.targetCount.WithLabelValues(src).Set(float64(n))
}

// endpointDialFailed counts a failed endpoint dial.
func (m *metrics) endpointDialFailed(r dialFailureReason) {
	m.endpointDialFails.WithLabelValues(string(r)).Inc()
}

// endpointDialed records how long a successful endpoint dial took.
func (m *metrics) endpointDialed(d time.Duration) { m.dialDuration.Observe(d.Seconds()) }

// endpointOpened and endpointClosed track open endpoint connections.
func (m *metrics) endpointOpened() { m.openEndpointConns.Inc() }
func (m *metrics) endpointClosed() { m.openEndpointConns.Dec() }

// dialStarted and dialEnded track endpoint dials in flight.
func (m *metrics) dialStarted() { m.dialsInFlight.Inc() }
func (m *metrics) dialEnded()   { m.dialsInFlight.Dec() }

// serverDialed counts one server dial by its result.
func (m *metrics) serverDialed(r dialResult) { m.serverDials.WithLabelValues(string(r)).Inc() }

// syncRound counts one round of the sync loop.
func (m *metrics) syncRound() { m.syncRounds.Inc() }
