package docgen

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	agentapp "github.com/servercount/servercount/cmd/proxy-agent/app"
	agentoptions "github.com/servercount/servercount/cmd/proxy-agent/app/options"
	serverapp "github.com/servercount/servercount/cmd/proxy-server/app"
	serveroptions "github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/pkitest"
)

// Metric is one metric a binary can export.
type Metric struct {
	// Name is the metric's full name.
	Name string
	// Type is counter, gauge, histogram or summary.
	Type string
	// Labels are its labels' names, constant ones first.
	Labels []string
	// Help is its HELP text.
	Help string
}

// Metrics returns every metric of servercount's own the proxy-server and
// the proxy-agent can export, by binary, sorted by name: what each
// binary's app.New registers with every feature turned on (TLS from
// files, DNS counting, leases, TokenReviews), on ports it listens on and
// closes without serving. Go's and the process's standard collectors
// (go_*, process_*) are left out. dir holds the files the features need:
// certificates, and a kubeconfig that is never used.
func Metrics(dir string) (map[string][]Metric, error) {
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kubeclient.WriteKubeconfig(kubeconfig, "https://127.0.0.1:1", "t"); err != nil {
		return nil, err
	}
	ca, err := pkitest.NewCA("docgen")
	if err != nil {
		return nil, err
	}
	certs, err := ca.WriteFiles(dir)
	if err != nil {
		return nil, err
	}
	srv, err := serverMetrics(kubeconfig, certs)
	if err != nil {
		return nil, fmt.Errorf("proxy-server: %w", err)
	}
	agt, err := agentMetrics(kubeconfig, certs)
	if err != nil {
		return nil, fmt.Errorf("proxy-agent: %w", err)
	}
	return map[string][]Metric{"proxy-server": srv, "proxy-agent": agt}, nil
}

func serverMetrics(kubeconfig string, certs pkitest.Files) ([]Metric, error) {
	o := serveroptions.NewOptions()
	o.ServerID = "docgen"
	o.ServerCert, o.ServerKey, o.ServerCACert = certs.ServerCert, certs.ServerKey, certs.CA
	o.ClusterCert, o.ClusterKey, o.ClusterCACert = certs.ServerCert, certs.ServerKey, certs.CA
	o.ServerBindAddress, o.AgentBindAddress, o.HealthBindAddress, o.AdminBindAddress = "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"
	o.ServerPort, o.AgentPort, o.HealthPort, o.AdminPort = 0, 0, 0, 0
	o.DNS.Name, o.DNS.Servers = "proxy-server.example.", []string{"127.0.0.1:1"}
	o.Leases.Enabled = true
	o.AgentNamespace, o.AgentServiceAccount = "kube-system", "konnectivity-agent"
	o.Kube.Kubeconfig = kubeconfig
	return registered(func(c *catalog) (*serverapp.Server, error) { return serverapp.New(o.Config(), c) })
}

func agentMetrics(kubeconfig string, certs pkitest.Files) ([]Metric, error) {
	o := agentoptions.NewOptions()
	o.AgentID = "docgen"
	o.AgentCert, o.AgentKey, o.CACert = certs.AgentCert, certs.AgentKey, certs.CA
	o.HealthServerHost, o.HealthServerPort, o.AdminBindAddress, o.AdminServerPort = "127.0.0.1", 0, "127.0.0.1", 0
	o.Count.DNS.Name, o.Count.DNS.Servers = "proxy-server.example.", []string{"127.0.0.1:1"}
	o.Count.Leases.Enabled = true
	o.Kube.Kubeconfig = kubeconfig
	return registered(func(c *catalog) (*agentapp.Agent, error) { return agentapp.New(o.Config(), c) })
}

// registered returns the metrics a binary registers while newApp builds
// it on a new catalog. The app is closed at once: it never serves.
func registered[A interface{ Close() }](newApp func(*catalog) (A, error)) ([]Metric, error) {
	c := newCatalog()
	app, err := newApp(c)
	if err != nil {
		return nil, err
	}
	app.Close()
	return c.metrics()
}

// catalog is a registry that also keeps the collectors registered on it,
// to describe them.
type catalog struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func newCatalog() *catalog { return &catalog{Registry: prometheus.NewRegistry()} }

// Register keeps col and registers it.
func (c *catalog) Register(col prometheus.Collector) error {
	if err := c.Registry.Register(col); err != nil {
		return err
	}
	c.collectors = append(c.collectors, col)
	return nil
}

// MustRegister keeps cs and registers them.
func (c *catalog) MustRegister(cs ...prometheus.Collector) {
	for _, col := range cs {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// descText parses prometheus.Desc.String, the one way client_golang
// gives a descriptor's name, help and labels.
var descText = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"),(?: unit: "[^"]*",)? constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

func (c *catalog) metrics() ([]Metric, error) {
	var out []Metric
	for _, col := range c.collectors {
		typ, err := collectorType(col)
		if err != nil {
			return nil, err
		}
		descs := make(chan *prometheus.Desc, 64)
		go func() { col.Describe(descs); close(descs) }()
		for d := range descs {
			m := descText.FindStringSubmatch(d.String())
			if m == nil {
				return nil, fmt.Errorf("cannot read descriptor %s", d)
			}
			name, err1 := strconv.Unquote(m[1])
			help, err2 := strconv.Unquote(m[2])
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("descriptor %s: %w", d, err)
			}
			var labels []string
			// Constant labels (the build's version) by name only: their
			// values are the build's.
			for pair := range strings.SplitSeq(m[3], ",") {
				if k, _, ok := strings.Cut(pair, "="); ok {
					labels = append(labels, k)
				}
			}
			for l := range strings.SplitSeq(m[4], ",") {
				if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
					labels = append(labels, l)
				}
			}
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
				continue // the standard collectors, documented by client_golang
			}
			out = append(out, Metric{Name: name, Type: typ, Labels: labels, Help: help})
		}
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b Metric) bool { return a.Name == b.Name }), nil
}

// collectorType is the type of what col exports: from its Go type for
// vectors, which export nothing until a label set is used, else from
// what it collects.
func collectorType(col prometheus.Collector) (string, error) {
	switch col.(type) {
	case *prometheus.CounterVec:
		return "counter", nil
	case *prometheus.GaugeVec:
		return "gauge", nil
	case *prometheus.HistogramVec:
		return "histogram", nil
	case *prometheus.SummaryVec:
		return "summary", nil
	}
	ms := make(chan prometheus.Metric, 64)
	go func() { col.Collect(ms); close(ms) }()
	typ := ""
	for m := range ms {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			return "", err
		}
		switch {
		case pb.Counter != nil:
			typ = "counter"
		case pb.Gauge != nil:
			typ = "gauge"
		case pb.Histogram != nil:
			typ = "histogram"
		case pb.Summary != nil:
			typ = "summary"
		default:
			typ = "untyped"
		}
	}
	if typ == "" {
		return "", fmt.Errorf("cannot tell the type of %T, which collects nothing", col)
	}
	return typ, nil
}

// WriteMetrics writes the metric reference in Markdown: a table per
// binary with each metric's name, type, labels and HELP text.
func WriteMetrics(w io.Writer, byBinary map[string][]Metric) error {
	var b strings.Builder
	b.WriteString(`# Metrics

Generated from the code by ` + "`make docs`" + ` (hack/docgen); a test fails
when this file and the code differ.

On each binary's health port (with ` + "`/healthz` and `/readyz`" + `) and admin
port (with pprof under ` + "`--enable-profiling`" + `). Everything under
` + "`konnectivity_network_proxy_*`" + ` is upstream's: name, type, labels, HELP
text and buckets, and, as upstream's, a labelled series appears when it
first happens (` + "`TestMetricsMatchUpstream`" + ` runs both binaries and holds
their ` + "`/metrics`" + ` to upstream's list in ` + "`test/upstream`" + `). Ours are
under ` + "`servercount_*`" + `. Some exist only with a feature: DNS counting
(` + "`dns_*`, `server_count_age_seconds`" + `), leases (` + "`lease_*`" + `), TokenReviews
(` + "`token_review*`" + `), TLS from files (` + "`certificate_*`" + `). Go's and the process's standard metrics
(` + "`go_*`, `process_*`" + `) are there too and not listed.
`)
	for _, bin := range []string{"proxy-server", "proxy-agent"} {
		fmt.Fprintf(&b, "\n## %s\n\n| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n", bin)
		for _, m := range byBinary[bin] {
			labels := ""
			if len(m.Labels) > 0 {
				labels = "`" + strings.Join(m.Labels, "`, `") + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, labels, cell(m.Help))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
