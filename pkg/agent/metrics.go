package agent

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The agent's metrics. Names under konnectivity_network_proxy_agent_ keep
// upstream's name and meaning, so that dashboards and tools written for
// the upstream agent work; our own are under servercount_agent_.
//
//	| name                                                              | type    | labels                          | meaning                                                  |
//	|-------------------------------------------------------------------|---------|---------------------------------|----------------------------------------------------------|
//	| konnectivity_network_proxy_agent_open_server_connections          | gauge   | -                               | servers connected (distinct serverIDs); 0 from start-up   |
//	| konnectivity_network_proxy_agent_known_server_count               | gauge   | -                               | the server count the agent aims for (its target)         |
//	| konnectivity_network_proxy_agent_endpoint_dial_failure_total      | counter | reason=timeout|unknown          | failed endpoint dials                                    |
//	| konnectivity_network_proxy_agent_open_endpoint_connections        | gauge   | -                               | open endpoint (tunnel) connections                       |
//	| servercount_agent_server_dials_total                              | counter | result=ok|duplicate|error       | server dials by outcome                                  |
//	| servercount_agent_target_server_count                             | gauge   | source=static|dns|fallback|received | the target, labelled by the source that decided it; one series at a time |
//	| servercount_agent_sync_rounds_total                               | counter | -                               | rounds of the sync loop, dialing or not                  |
const (
	upstreamNamespace = "konnectivity_network_proxy"
	upstreamSubsystem = "agent"
	ourNamespace      = "servercount"
	ourSubsystem      = "agent"
)

// dialFailureReason labels endpoint_dial_failure_total.
type dialFailureReason string

// Reasons for a failed endpoint dial, as upstream names them.
const (
	dialFailureTimeout dialFailureReason = "timeout"
	dialFailureUnknown dialFailureReason = "unknown"
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
	// dialNone: no dial was made, as every resolved endpoint is connected.
	dialNone dialResult = "none"
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
}

// newMetrics builds the collectors and registers them on reg, unless reg
// is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		openServerConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: upstreamNamespace, Subsystem: upstreamSubsystem,
			Name: "open_server_connections",
			Help: "Current number of open server connections.",
		}),
		knownServerCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: upstreamNamespace, Subsystem: upstreamSubsystem,
			Name: "known_server_count",
			Help: "Current number of servers agent is trying to connect to.",
		}),
		endpointDialFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: upstreamNamespace, Subsystem: upstreamSubsystem,
			Name: "endpoint_dial_failure_total",
			Help: "Number of failures dialing the remote endpoint, by reason (example: timeout).",
		}, []string{"reason"}),
		openEndpointConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: upstreamNamespace, Subsystem: upstreamSubsystem,
			Name: "open_endpoint_connections",
			Help: "Current number of open endpoint connections.",
		}),
		serverDials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ourNamespace, Subsystem: ourSubsystem,
			Name: "server_dials_total",
			Help: "Number of Connect streams opened to proxy-servers, by result (ok, duplicate, error).",
		}, []string{"result"}),
		targetCount: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ourNamespace, Subsystem: ourSubsystem,
			Name: "target_server_count",
			Help: "Server count the agent aims for, labelled by the source that decided it (static, dns, fallback, received).",
		}, []string{"source"}),
		syncRounds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ourNamespace, Subsystem: ourSubsystem,
			Name: "sync_rounds_total",
			Help: "Number of rounds of the agent's sync loop, whether it dialed or not.",
		}),
	}
	// Create the labelled series up front so that they exist at 0.
	for _, r := range []dialFailureReason{dialFailureTimeout, dialFailureUnknown} {
		m.endpointDialFails.WithLabelValues(string(r))
	}
	for _, r := range []dialResult{dialOK, dialDuplicate, dialError} {
		m.serverDials.WithLabelValues(string(r))
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register agent metrics (is a second ClientSet using the same Registerer?): %w", err)
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.openServerConns, m.knownServerCount, m.endpointDialFails, m.openEndpointConns,
		m.serverDials, m.targetCount, m.syncRounds,
	}
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

// endpointOpened and endpointClosed track open endpoint connections.
func (m *metrics) endpointOpened() { m.openEndpointConns.Inc() }
func (m *metrics) endpointClosed() { m.openEndpointConns.Dec() }

// serverDialed counts one server dial by its result.
func (m *metrics) serverDialed(r dialResult) { m.serverDials.WithLabelValues(string(r)).Inc() }

// syncRound counts one round of the sync loop.
func (m *metrics) syncRound() { m.syncRounds.Inc() }
