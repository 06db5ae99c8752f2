package server

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The server's metrics. Names keep upstream's where the meaning is the
// same; counters end in _total.
//
//	| name                                                          | type    | labels         | meaning                                                        |
//	|---------------------------------------------------------------|---------|----------------|----------------------------------------------------------------|
//	| konnectivity_network_proxy_server_ready_backend_connections   | gauge   |                | connected agent streams (an agent may hold several)            |
//	| konnectivity_network_proxy_server_grpc_connections            | gauge   | service_method | open gRPC streams: "AgentService/Connect", "ProxyService/Proxy" |
//	| konnectivity_network_proxy_server_http_connections            | gauge   |                | open HTTP CONNECT tunnels (after the 200)                      |
//	| konnectivity_network_proxy_server_pending_backend_dials       | gauge   |                | dials sent to an agent and not yet answered                    |
//	| konnectivity_network_proxy_server_established_connections     | gauge   |                | tunnels with a connectID, over all frontends                   |
//	| konnectivity_network_proxy_server_dial_failure_total          | counter | reason         | dials that failed, by [DialFailureReason]                      |
//	| servercount_server_reported_server_count                      | gauge   |                | the last serverCount sent to an agent                          |
//	| servercount_server_agent_rejections_total                     | counter | reason         | agent streams refused at the handshake, by [RejectReason]      |
//	| servercount_server_frontends_waiting_for_agent                | gauge   |                | frontends whose next packet waits for room in an agent's queue |
const (
	metricsNamespace = "konnectivity_network_proxy"
	metricsSubsystem = "server"
)

// DialFailureReason is the reason label of the dial failure counter.
type DialFailureReason string

// The dial failure reasons.
const (
	// DialFailureNoAgent: no strategy found an agent.
	DialFailureNoAgent DialFailureReason = "no_agent"
	// DialFailureBackend: the agent answered DIAL_RSP with an error.
	DialFailureBackend DialFailureReason = "backend_error"
	// DialFailureTimeout: no DIAL_RSP within Config.BackendDialTimeout.
	DialFailureTimeout DialFailureReason = "timeout"
	// DialFailureBackendClosed: the agent stream ended before it answered.
	DialFailureBackendClosed DialFailureReason = "backend_closed"
	// DialFailureFrontendClosed: the frontend gave up (DIAL_CLS, or its
	// stream or connection ended) before the agent answered.
	DialFailureFrontendClosed DialFailureReason = "frontend_closed"
	// DialFailureDuplicate: the frontend reused a random of a pending dial,
	// or the agent answered with a connectID the frontend already uses.
	DialFailureDuplicate DialFailureReason = "duplicate_id"
)

var dialFailureReasons = []DialFailureReason{
	DialFailureNoAgent, DialFailureBackend, DialFailureTimeout,
	DialFailureBackendClosed, DialFailureFrontendClosed, DialFailureDuplicate,
}

// String returns the label value.
func (r DialFailureReason) String() string { return string(r) }

// RejectReason is the reason label of the agent rejection counter.
type RejectReason string

// The agent rejection reasons.
const (
	// RejectInvalidMetadata: agentID missing or repeated, or bad
	// agentIdentifiers.
	RejectInvalidMetadata RejectReason = "invalid_metadata"
	// RejectUnauthenticated: the bearer token is missing, malformed or not
	// accepted.
	RejectUnauthenticated RejectReason = "unauthenticated"
	// RejectShuttingDown: the server was closing.
	RejectShuttingDown RejectReason = "shutting_down"
)

var rejectReasons = []RejectReason{RejectInvalidMetadata, RejectUnauthenticated, RejectShuttingDown}

// String returns the label value.
func (r RejectReason) String() string { return string(r) }

// serviceMethod is the service_method label of the gRPC connections gauge.
type serviceMethod string

const (
	methodAgentConnect serviceMethod = "AgentService/Connect"
	methodProxy        serviceMethod = "ProxyService/Proxy"
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
	waitingForAgent prometheus.Gauge
}

// newMetrics builds the collectors and registers them on reg, if not nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		backends: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "ready_backend_connections",
			Help: "Number of connected agent streams (backends) ready to serve dials.",
		}),
		grpcConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "grpc_connections",
			Help: "Number of open gRPC streams, by service method.",
		}, []string{"service_method"}),
		httpConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "http_connections",
			Help: "Number of open HTTP CONNECT tunnels.",
		}),
		pendingDials: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "pending_backend_dials",
			Help: "Number of dials sent to an agent and not yet answered.",
		}),
		established: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "established_connections",
			Help: "Number of tunnel connections established through an agent.",
		}),
		dialFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "dial_failure_total",
			Help: "Number of dials that failed, by reason.",
		}, []string{"reason"}),
		reportedCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "servercount", Subsystem: metricsSubsystem, Name: "reported_server_count",
			Help: "The server count last sent to an agent in the serverCount header.",
		}),
		agentRejection: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "servercount", Subsystem: metricsSubsystem, Name: "agent_rejections_total",
			Help: "Number of agent streams refused at the handshake, by reason.",
		}, []string{"reason"}),
		waitingForAgent: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "servercount", Subsystem: metricsSubsystem, Name: "frontends_waiting_for_agent",
			Help: "Number of frontends (gRPC streams and HTTP CONNECT tunnels) whose next packet waits for room in an agent stream's send queue: an agent that does not read holds them.",
		}),
	}
	// Make every label value exist from the start, so that dashboards and
	// alerts see zeros instead of missing series.
	for _, r := range dialFailureReasons {
		m.dialFailures.WithLabelValues(string(r))
	}
	for _, r := range rejectReasons {
		m.agentRejection.WithLabelValues(string(r))
	}
	for _, sm := range []serviceMethod{methodAgentConnect, methodProxy} {
		m.grpcConns.WithLabelValues(string(sm))
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.backends, m.grpcConns, m.httpConns, m.pendingDials, m.established, m.dialFailures, m.reportedCount, m.agentRejection, m.waitingForAgent} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register proxy-server metrics (is another Server registered on the same registry?): %w", err)
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
func (m *metrics) observeDialFailure(r DialFailureReason) {
	m.dialFailures.WithLabelValues(string(r)).Inc()
}
func (m *metrics) setReportedServerCount(n int) { m.reportedCount.Set(float64(n)) }
func (m *metrics) observeAgentRejection(r RejectReason) {
	m.agentRejection.WithLabelValues(string(r)).Inc()
}
func (m *metrics) addWaitingForAgent(n int) { m.waitingForAgent.Add(float64(n)) }
