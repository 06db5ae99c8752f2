// Package leasecount turns the agent's lease flags (--count-server-leases
// and friends, as upstream names them) into a lease.Counter with
// upstream's lease metrics.
package leasecount

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/servercount/servercount/pkg/lease"
)

// Options are the agent's lease flags.
type Options struct {
	// Enabled counts servers by their leases (--count-server-leases).
	Enabled bool
	// Namespace holds the leases (--lease-namespace).
	Namespace string
	// LabelSelector selects them (--lease-label-selector, or the
	// deprecated --lease-label).
	LabelSelector string
}

// NewOptions returns upstream's defaults.
func NewOptions() *Options {
	return &Options{Namespace: lease.DefaultNamespace, LabelSelector: lease.DefaultLabelSelector}
}

// AddFlags adds the lease flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Enabled, "count-server-leases", o.Enabled, "count proxy-servers by their Kubernetes Leases (needs get, list and watch on leases in --lease-namespace)")
	fs.StringVar(&o.Namespace, "lease-namespace", o.Namespace, "namespace of the proxy-servers' leases")
	fs.StringVar(&o.LabelSelector, "lease-label-selector", o.LabelSelector, "label selector of the proxy-servers' leases")
	fs.StringVar(&o.LabelSelector, "lease-label", o.LabelSelector, "label selector of the proxy-servers' leases")
	_ = fs.MarkDeprecated("lease-label", "use --lease-label-selector")
}

// Validate returns every problem with o, each naming its flag.
func (o *Options) Validate() []error {
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

// Build starts counting leases through client, and registers upstream's
// agent lease metrics with reg (which may be nil).
func (o *Options) Build(client kubernetes.Interface, reg prometheus.Registerer) (*lease.Counter, error) {
	m := newMetrics()
	if reg != nil {
		for _, c := range []prometheus.Collector{m.lists, m.watches, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register lease metrics: %w", err)
			}
		}
	}
	c, err := lease.NewCounter(lease.CounterConfig{Client: client, Namespace: o.Namespace, LabelSelector: o.LabelSelector, Observe: m.observe})
	if err != nil {
		return nil, fmt.Errorf("--count-server-leases: %w", err)
	}
	return c, nil
}

// metrics are upstream's agent lease metrics, with its names, labels, HELP
// texts and buckets; a labelled series appears when it first happens.
type metrics struct {
	lists, watches *prometheus.CounterVec
	latency        *prometheus.HistogramVec
}

func newMetrics() *metrics {
	const ns, sub = "konnectivity_network_proxy", "agent"
	return &metrics{
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_lists_total",
			Help: "Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
		}, []string{"http_response_code", "reason"}),
		watches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_watches_total",
			Help: "Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
		}, []string{"http_response_code", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_list_latency_seconds",
			Help:    "Latency of server lease listing in seconds",
			Buckets: []float64{0.005, 0.025, 0.1, 0.5, 2.5, 10, 30},
		}, []string{"http_response_code"}),
	}
}

func (m *metrics) observe(c lease.Call) {
	code := strconv.Itoa(c.Code)
	switch c.Verb {
	case "list":
		m.lists.WithLabelValues(code, c.Reason).Inc()
		m.latency.WithLabelValues(code).Observe(c.Duration.Seconds())
	case "watch":
		m.watches.WithLabelValues(code, c.Reason).Inc()
	}
}
