// Package leasepublish turns the proxy-server's lease flags
// (--enable-lease-controller and friends, as upstream names them) into a
// lease.Publisher with upstream's lease garbage-collection metrics.
package leasepublish

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

// Options are the server's lease flags.
type Options struct {
	// Enabled publishes this server's lease and collects expired ones
	// (--enable-lease-controller).
	Enabled bool
	// Namespace holds the leases (--lease-namespace).
	Namespace string
	// Labels label the lease (--lease-label).
	Labels string
}

// NewOptions returns upstream's defaults.
func NewOptions() *Options {
	return &Options{Namespace: lease.DefaultNamespace, Labels: lease.DefaultLabelSelector}
}

// AddFlags adds the lease flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Enabled, "enable-lease-controller", o.Enabled, "publish and renew this server's Lease, and delete expired ones (needs get, list, create, update and delete on leases in --lease-namespace)")
	fs.StringVar(&o.Namespace, "lease-namespace", o.Namespace, "namespace of the proxy-servers' leases")
	fs.StringVar(&o.Labels, "lease-label", o.Labels, "labels of the published lease, key=value pairs separated by commas")
}

// Validate returns every problem with o, each naming its flag.
func (o *Options) Validate() []error {
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

// Build returns the publisher of serverID's lease, and registers
// upstream's lease controller metrics with reg (which may be nil).
func (o *Options) Build(client kubernetes.Interface, serverID string, reg prometheus.Registerer) (*lease.Publisher, error) {
	m := newMetrics()
	if reg != nil {
		for _, c := range []prometheus.Collector{m.culled, m.deletes, m.lists, m.latency} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register lease metrics: %w", err)
			}
		}
	}
	p, err := lease.NewPublisher(lease.PublisherConfig{Client: client, ServerID: serverID, Namespace: o.Namespace, Labels: o.Labels, Observe: m.observe})
	if err != nil {
		return nil, fmt.Errorf("--enable-lease-controller: %w", err)
	}
	return p, nil
}

// metrics are upstream's server lease metrics, with its names, labels and
// HELP texts (typos included: dashboards match them); a labelled series
// appears when it first happens.
type metrics struct {
	culled, deletes, lists *prometheus.CounterVec
	latency                *prometheus.HistogramVec
}

func newMetrics() *metrics {
	const ns, sub = "konnectivity_network_proxy", "server"
	return &metrics{
		culled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "culled_leases_count",
			Help: "Count of expired leases that the lease garbage collection controller has culled.",
		}, []string{"http_status_code"}),
		deletes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_delete_total",
			Help: "Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.",
		}, []string{"http_status_code", "reason"}),
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_list_total",
			Help: "Count of lease deletion calls by the garbage collection controller. Labeled by HTTP status code and reason.",
		}, []string{"http_status_code", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_list_latency_seconds",
			Help: "Latency of lease list calls by the garbage collection controller in seconds.",
		}, []string{"http_status_code"}),
	}
}

func (m *metrics) observe(c lease.Call) {
	code := strconv.Itoa(c.Code)
	switch c.Verb {
	case "list":
		m.lists.WithLabelValues(code, c.Reason).Inc()
		m.latency.WithLabelValues(code).Observe(c.Duration.Seconds())
	case "delete":
		m.deletes.WithLabelValues(code, c.Reason).Inc()
		if c.Culled {
			m.culled.WithLabelValues(code).Inc()
		}
	}
}
