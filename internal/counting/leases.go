package counting

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/pkg/lease"
)

// LeaseOptions are the agent's lease flags.
type LeaseOptions struct {
	// Enabled counts servers by their leases (--count-server-leases).
	Enabled bool
	// Namespace holds the leases (--lease-namespace).
	Namespace string
	// LabelSelector selects them (--lease-label-selector, or the
	// deprecated --lease-label).
	LabelSelector string
}

// NewLeaseOptions returns upstream's defaults.
func NewLeaseOptions() *LeaseOptions {
	return &LeaseOptions{Namespace: lease.DefaultNamespace, LabelSelector: lease.DefaultLabelSelector}
}

// AddFlags adds the lease flags to fs.
func (o *LeaseOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Enabled, "count-server-leases", o.Enabled, "count proxy-servers by their Kubernetes Leases (needs get, list and watch on leases in --lease-namespace)")
	fs.StringVar(&o.Namespace, "lease-namespace", o.Namespace, "namespace of the proxy-servers' leases")
	fs.StringVar(&o.LabelSelector, "lease-label-selector", o.LabelSelector, "label selector of the proxy-servers' leases")
	fs.StringVar(&o.LabelSelector, "lease-label", o.LabelSelector, "label selector of the proxy-servers' leases")
	_ = fs.MarkDeprecated("lease-label", "use --lease-label-selector")
}

// Validate returns every problem with o, each naming its flag.
func (o *LeaseOptions) Validate() []error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if o.Namespace == "" {
		errs = append(errs, errors.New("--lease-namespace must not be empty with --count-server-leases"))
	}
	if _, err := labels.Parse(o.LabelSelector); err != nil {
		errs = append(errs, fmt.Errorf("invalid --lease-label-selector %q: %w", o.LabelSelector, err))
	}
	return errs
}

// Build starts counting leases through the API server rc reaches, and
// registers upstream's agent lease metrics with reg (which may be nil).
func (o *LeaseOptions) Build(rc *rest.Config, reg prometheus.Registerer) (*lease.Counter, error) {
	client, err := kubeclient.NewLeases(rc, o.Namespace)
	if err != nil {
		return nil, fmt.Errorf("--count-server-leases: %w", err)
	}
	m := newCountMetrics()
	if err := metric.Register(reg, "lease metrics", m.lists, m.watches, m.latency); err != nil {
		return nil, err
	}
	c, err := lease.NewCounter(lease.CounterConfig{Client: client, LabelSelector: o.LabelSelector, Observe: m.observe})
	if err != nil {
		return nil, fmt.Errorf("--count-server-leases: %w", err)
	}
	return c, nil
}

// metrics are upstream's agent lease metrics, with its names, labels, HELP
// texts and buckets; a labelled series appears when it first happens.
type countMetrics struct {
	lists, watches *prometheus.CounterVec
	latency        *prometheus.HistogramVec
}

func newCountMetrics() *countMetrics {
	upstream := metric.Prefix{Namespace: "konnectivity_network_proxy", Subsystem: "agent"}
	return &countMetrics{
		lists: upstream.CounterVec("lease_lists_total",
			"Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason", "http_response_code", "reason"),
		watches: upstream.CounterVec("lease_watches_total",
			"Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason", "http_response_code", "reason"),
		latency: upstream.HistogramVec("lease_list_latency_seconds",
			"Latency of server lease listing in seconds", []float64{0.005, 0.025, 0.1, 0.5, 2.5, 10, 30}, "http_response_code"),
	}
}

func (m *countMetrics) observe(c lease.Call) {
	code := strconv.Itoa(c.Code)
	switch c.Verb {
	case "list":
		m.lists.WithLabelValues(code, c.Reason).Inc()
		m.latency.WithLabelValues(code).Observe(c.Duration.Seconds())
	case "watch":
		m.watches.WithLabelValues(code, c.Reason).Inc()
	}
}

// PublishOptions are the server's lease flags.
type PublishOptions struct {
	// Enabled publishes this server's lease and collects expired ones
	// (--enable-lease-controller).
	Enabled bool
	// Namespace holds the leases (--lease-namespace).
	Namespace string
	// Labels label the lease (--lease-label).
	Labels string
}

// NewPublishOptions returns upstream's defaults.
func NewPublishOptions() *PublishOptions {
	return &PublishOptions{Namespace: lease.DefaultNamespace, Labels: lease.DefaultLabelSelector}
}

// AddFlags adds the lease flags to fs.
func (o *PublishOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Enabled, "enable-lease-controller", o.Enabled, "publish and renew this server's Lease, and delete expired ones (needs get, list, create, update and delete on leases in --lease-namespace)")
	fs.StringVar(&o.Namespace, "lease-namespace", o.Namespace, "namespace of the proxy-servers' leases")
	fs.StringVar(&o.Labels, "lease-label", o.Labels, "labels of the published lease, key=value pairs separated by commas")
}

// Validate returns every problem with o, each naming its flag.
func (o *PublishOptions) Validate() []error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if o.Namespace == "" {
		errs = append(errs, errors.New("--lease-namespace must not be empty with --enable-lease-controller"))
	}
	if set, err := labels.ConvertSelectorToLabelsMap(o.Labels); err != nil || len(set) == 0 {
		errs = append(errs, fmt.Errorf("invalid --lease-label %q: want key=value pairs separated by commas", o.Labels))
	}
	return errs
}

// Build returns the publisher of serverID's lease through the API server
// rc reaches, which counts its calls in m.
func (o *PublishOptions) Build(rc *rest.Config, serverID string, m *PublishMetrics) (*lease.Publisher, error) {
	client, err := kubeclient.NewLeases(rc, o.Namespace)
	if err != nil {
		return nil, fmt.Errorf("--enable-lease-controller: %w", err)
	}
	p, err := lease.NewPublisher(lease.PublisherConfig{Client: client, ServerID: serverID, Labels: o.Labels, Observe: m.observe})
	if err != nil {
		return nil, fmt.Errorf("--enable-lease-controller: %w", err)
	}
	return p, nil
}

// PublishMetrics are upstream's server lease metrics, with its names,
// labels and HELP texts (typos included: dashboards match them). A server
// registers them whether or not it publishes leases, as upstream's does:
// culled_leases_count is there, at 0, from the start, and a labelled
// series appears when it first happens.
type PublishMetrics struct {
	culled         prometheus.Counter
	deletes, lists *prometheus.CounterVec
	latency        *prometheus.HistogramVec
}

// NewPublishMetrics returns the server's lease metrics, registered on reg
// unless it is nil.
func NewPublishMetrics(reg prometheus.Registerer) (*PublishMetrics, error) {
	upstream := metric.Prefix{Namespace: "konnectivity_network_proxy", Subsystem: "server"}
	m := &PublishMetrics{
		culled: upstream.Counter("culled_leases_count",
			"Count of expired leases that the lease garbage collection controller has culled."),
		deletes: upstream.CounterVec("lease_delete_total",
			"Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.", "http_status_code", "reason"),
		lists: upstream.CounterVec("lease_list_total",
			"Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.", "http_status_code", "reason"),
		latency: upstream.HistogramVec("lease_list_latency_seconds",
			"Latency of lease list calls by the garbage collection controller in seconds.", nil, "http_status_code"),
	}
	if err := metric.Register(reg, "lease metrics", m.culled, m.deletes, m.lists, m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *PublishMetrics) observe(c lease.Call) {
	code := strconv.Itoa(c.Code)
	switch c.Verb {
	case "list":
		m.lists.WithLabelValues(code, c.Reason).Inc()
		m.latency.WithLabelValues(code).Observe(c.Duration.Seconds())
	case "delete":
		m.deletes.WithLabelValues(code, c.Reason).Inc()
		if c.Culled && c.Code == 200 {
			m.culled.Inc()
		}
	}
}
