// Package upstream holds facts about upstream Konnectivity
// (apiserver-network-proxy v0.37) as data: the flags of its proxy-server
// and proxy-agent and the metrics they export, so that tests hold our
// binaries to them. The facts come from upstream's --help and metric
// definitions; no upstream code is here.
package upstream

// Flag is one command-line flag as upstream's --help lists it.
type Flag struct {
	// Name is the flag's name, without dashes.
	Name string
	// Type is the type --help prints: bool, string, int, uint, float32,
	// duration, strings, severity, traceLocation or moduleSpec.
	Type string
}

// Arg returns a --name=value argument with a value of f's type that
// upstream accepts.
func (f Flag) Arg() string {
	v, ok := sampleValues[f.Name]
	if !ok {
		v = samples[f.Type]
	}
	return "--" + f.Name + "=" + v
}

// sampleValues are values upstream accepts for flags whose type allows
// more than it does.
var sampleValues = map[string]string{
	"mode":                  "grpc",
	"proxy-strategies":      "default",
	"server-count-source":   "default",
	"tls-min-version":       "VersionTLS12",
	"cipher-suites":         "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"kube-api-content-type": "application/vnd.kubernetes.protobuf",
	"lease-label":           "k8s-app=konnectivity-server",
	"lease-label-selector":  "k8s-app=konnectivity-server",
	"agent-identifiers":     "host=node-1",
}

var samples = map[string]string{
	"bool": "false", "string": "", "int": "1", "uint": "1", "float32": "1",
	"duration": "1s", "strings": "", "severity": "INFO", "traceLocation": "", "moduleSpec": "",
}

// Metric is one metric upstream exports.
type Metric struct {
	// Name is the full name, konnectivity_network_proxy_<binary>_<name>.
	Name string
	// Binary exports it: "server" or "agent".
	Binary string
	// Type is counter, gauge or histogram.
	Type string
	// Labels are its label names, in upstream's order.
	Labels []string
	// Help is its HELP text, verbatim.
	Help string
	// Buckets are a histogram's bucket bounds; nil for prometheus's
	// default buckets.
	Buckets []float64
}

// Histogram buckets upstream uses.
var (
	serverLatencyBuckets      = []float64{0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5}
	connectionDurationBuckets = []float64{1, 5, 15, 30, 60, 300, 900, 1800, 3600, 14400, 43200, 86400}
	agentLatencyBuckets       = []float64{0.005, 0.025, 0.1, 0.5, 2.5, 10, 30}
)

// klogFlags are the flags klog adds to both of upstream's binaries.
var klogFlags = []Flag{
	{"add-dir-header", "bool"},
	{"alsologtostderr", "bool"},
	{"alsologtostderrthreshold", "severity"},
	{"legacy-stderr-threshold-behavior", "bool"},
	{"log-backtrace-at", "traceLocation"},
	{"log-dir", "string"},
	{"log-file", "string"},
	{"log-file-max-size", "uint"},
	{"logtostderr", "bool"},
	{"one-output", "bool"},
	{"skip-headers", "bool"},
	{"skip-log-headers", "bool"},
	{"stderrthreshold", "severity"},
	{"vmodule", "moduleSpec"},
}

// ServerFlags are upstream's proxy-server flags, klog's included.
var ServerFlags = append([]Flag{
	{"admin-bind-address", "string"},
	{"admin-port", "int"},
	{"agent-bind-address", "string"},
	{"agent-namespace", "string"},
	{"agent-port", "int"},
	{"agent-service-account", "string"},
	{"authentication-audience", "string"},
	{"backend-dial-timeout", "duration"},
	{"cipher-suites", "strings"},
	{"cluster-ca-cert", "string"},
	{"cluster-cert", "string"},
	{"cluster-key", "string"},
	{"delete-existing-uds-file", "bool"},
	{"enable-contention-profiling", "bool"},
	{"enable-lease-controller", "bool"},
	{"enable-profiling", "bool"},
	{"frontend-keepalive-time", "duration"},
	{"graceful-shutdown-timeout", "duration"},
	{"health-bind-address", "string"},
	{"health-port", "int"},
	{"keepalive-time", "duration"},
	{"kube-api-content-type", "string"},
	{"kubeconfig", "string"},
	{"kubeconfig-burst", "int"},
	{"kubeconfig-qps", "float32"},
	{"lease-label", "string"},
	{"lease-namespace", "string"},
	{"mode", "string"},
	{"proxy-strategies", "string"},
	{"server-bind-address", "string"},
	{"server-ca-cert", "string"},
	{"server-cert", "string"},
	{"server-count", "int"},
	{"server-id", "string"},
	{"server-key", "string"},
	{"server-port", "int"},
	{"tls-min-version", "string"},
	{"uds-name", "string"},
	{"xfr-channel-size", "int"},
}, klogFlags...)

// AgentFlags are upstream's proxy-agent flags, klog's included.
var AgentFlags = append([]Flag{
	{"admin-bind-address", "string"},
	{"admin-server-port", "int"},
	{"agent-cert", "string"},
	{"agent-id", "string"},
	{"agent-identifiers", "string"},
	{"agent-key", "string"},
	{"alpn-proto", "strings"},
	{"ca-cert", "string"},
	{"count-server-leases", "bool"},
	{"enable-contention-profiling", "bool"},
	{"enable-profiling", "bool"},
	{"health-server-host", "string"},
	{"health-server-port", "int"},
	{"keepalive-time", "duration"},
	{"kube-api-content-type", "string"},
	{"kubeconfig", "string"},
	{"lease-label-selector", "string"},
	{"lease-namespace", "string"},
	{"probe-interval", "duration"},
	{"proxy-server-host", "string"},
	{"proxy-server-port", "int"},
	{"server-count-source", "string"},
	{"service-account-token-path", "string"},
	{"sync-forever", "bool"},
	{"sync-interval", "duration"},
	{"sync-interval-cap", "duration"},
	{"warn-on-channel-limit", "bool"},
	{"xfr-channel-size", "int"},
}, klogFlags...)

// Metrics are the metrics upstream exports under konnectivity_network_proxy_*.
var Metrics = []Metric{
	{Name: "konnectivity_network_proxy_server_dial_duration_seconds", Binary: "server", Type: "histogram", Labels: nil, Help: "Latency of dial to the remote endpoint in seconds", Buckets: serverLatencyBuckets},
	{Name: "konnectivity_network_proxy_server_frontend_write_duration_seconds", Binary: "server", Type: "histogram", Labels: nil, Help: "Latency of write to the frontend in seconds", Buckets: serverLatencyBuckets},
	{Name: "konnectivity_network_proxy_server_connection_duration_seconds", Binary: "server", Type: "histogram", Labels: nil, Help: "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.", Buckets: connectionDurationBuckets},
	{Name: "konnectivity_network_proxy_server_grpc_connections", Binary: "server", Type: "gauge", Labels: []string{"service_method"}, Help: "Number of current grpc connections, partitioned by service method.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_http_connections", Binary: "server", Type: "gauge", Labels: nil, Help: "Number of current HTTP CONNECT connections", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_ready_backend_connections", Binary: "server", Type: "gauge", Labels: nil, Help: "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_ready_backends", Binary: "server", Type: "gauge", Labels: []string{"proxy_strategy"}, Help: "Number of konnectivity agent connected to the proxy server", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_pending_backend_dials", Binary: "server", Type: "gauge", Labels: nil, Help: "Current number of pending backend dial requests", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_established_connections", Binary: "server", Type: "gauge", Labels: nil, Help: "Current number of established end-to-end connections (post-dial).", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_full_receive_channels", Binary: "server", Type: "gauge", Labels: []string{"service_method"}, Help: "Number of current connections blocked by a full receive channel, partitioned by service method.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_dial_failure_count", Binary: "server", Type: "counter", Labels: []string{"reason"}, Help: "Number of dial failures observed. Multiple failures can occur for a single dial request.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_culled_leases_count", Binary: "server", Type: "counter", Labels: nil, Help: "Count of expired leases that the lease garbage collection controller has culled.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_lease_delete_total", Binary: "server", Type: "counter", Labels: []string{"http_status_code", "reason"}, Help: "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_lease_list_latency_seconds", Binary: "server", Type: "histogram", Labels: []string{"http_status_code"}, Help: "Latency of lease list calls by the garbage collection controller in seconds.", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_lease_list_total", Binary: "server", Type: "counter", Labels: []string{"http_status_code", "reason"}, Help: "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_dial_duration_seconds", Binary: "agent", Type: "histogram", Labels: nil, Help: "Latency of dial to the remote endpoint in seconds", Buckets: agentLatencyBuckets},
	{Name: "konnectivity_network_proxy_agent_server_connection_failure_count", Binary: "agent", Type: "counter", Labels: []string{"direction"}, Help: "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_endpoint_dial_failure_total", Binary: "agent", Type: "counter", Labels: []string{"reason"}, Help: "Number of failures dialing the remote endpoint, by reason (example: timeout).", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_open_server_connections", Binary: "agent", Type: "gauge", Labels: nil, Help: "Current number of open server connections.", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_known_server_count", Binary: "agent", Type: "gauge", Labels: nil, Help: "Current number of servers agent is trying to connect to.", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_open_endpoint_connections", Binary: "agent", Type: "gauge", Labels: nil, Help: "Current number of open endpoint connections.", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_lease_lists_total", Binary: "agent", Type: "counter", Labels: []string{"http_response_code", "reason"}, Help: "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_lease_watches_total", Binary: "agent", Type: "counter", Labels: []string{"http_response_code", "reason"}, Help: "Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_lease_list_latency_seconds", Binary: "agent", Type: "histogram", Labels: []string{"http_response_code"}, Help: "Latency of server lease listing in seconds", Buckets: agentLatencyBuckets},
	{Name: "konnectivity_network_proxy_server_stream_packets_total", Binary: "server", Type: "counter", Labels: []string{"segment", "packet_type"}, Help: "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_stream_packets_total", Binary: "agent", Type: "counter", Labels: []string{"segment", "packet_type"}, Help: "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)", Buckets: nil},
	{Name: "konnectivity_network_proxy_server_stream_errors_total", Binary: "server", Type: "counter", Labels: []string{"segment", "code", "packet_type"}, Help: "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)", Buckets: nil},
	{Name: "konnectivity_network_proxy_agent_stream_errors_total", Binary: "agent", Type: "counter", Labels: []string{"segment", "code", "packet_type"}, Help: "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)", Buckets: nil},
}
