package counting

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/servercount/servercount/internal/flagvalue"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/pkg/servercounter"
)

// AgentOptions are the proxy-agent's count-source flags.
type AgentOptions struct {
	// DNS counts servers through their headless Service
	// (--server-count-dns and its companions, --server-count-max and
	// --fallback-server-count among them).
	DNS *DNSOptions
	// Leases counts servers by their Leases (--count-server-leases).
	Leases *LeaseOptions
	// SourceMax is --server-count-source=max: aim for the largest of the
	// counts known, the servers' reported ones included.
	SourceMax bool
	// Max is --server-count-max: the agent never aims for more servers,
	// whatever DNS, the leases or the servers say.
	Max int
}

// NewAgentOptions returns upstream's defaults and ours.
func NewAgentOptions() *AgentOptions {
	return &AgentOptions{DNS: NewDNSOptions(), Leases: NewLeaseOptions(), Max: servercounter.DefaultMax}
}

// AddFlags adds the count-source flags to fs.
func (o *AgentOptions) AddFlags(fs *pflag.FlagSet) {
	flagvalue.Var(fs, &o.SourceMax, "server-count-source", sourceText(o.SourceMax), parseSource,
		"how to combine server counts: default (DNS when --server-count-dns is set, else what servers report) or max (the larger of the two)")
	fs.IntVar(&o.Max, "server-count-max", o.Max, "never aim for more proxy-servers than this, whatever DNS, the leases or the servers say: a broken or hostile count must not open thousands of connections")
	o.DNS.AddFlags(fs, true)
	o.Leases.AddFlags(fs)
}

// Validate returns every problem with o, each naming its flag.
func (o *AgentOptions) Validate() []error {
	errs := append(o.DNS.Validate(), o.Leases.Validate()...)
	return append(errs, ValidateMax(o.Max)...)
}

// ValidateMax checks --server-count-max, which both binaries have: 0
// would mean no bound to the library, and no bound is what the flag is
// there to prevent.
func ValidateMax(max int) []error {
	if max < 1 {
		return []error{fmt.Errorf("invalid --server-count-max %d: must be at least 1", max)}
	}
	return nil
}

// parseSource parses --server-count-source: true for "max".
func parseSource(s string) (bool, error) {
	switch s {
	case "default":
		return false, nil
	case "max":
		return true, nil
	}
	return false, errors.New("use default or max")
}

func sourceText(max bool) string {
	if max {
		return "max"
	}
	return "default"
}

// Counter is the agent's count: it counts, says when the count changes,
// and is closed when the agent stops.
type Counter interface {
	servercounter.Counter
	servercounter.Notifier
	io.Closer
}

// Build builds the agent's count from the sources o enables, their
// metrics registered on reg, leases read through kube. Without a source
// the counter is nil: the agent goes by the counts servers report, as
// upstream's does. With one, that source; with both, the larger of the
// two, so that no server is missed while a second source catches up.
// Close the counter once the agent has stopped.
func (o *AgentOptions) Build(kube kubeclient.Options, reg prometheus.Registerer) (Counter, error) {
	var sources []Counter
	closeAll := func() {
		for _, s := range slices.Backward(sources) {
			_ = s.Close() // the counters' Close does not fail
		}
	}
	if o.DNS.Enabled() {
		cache, err := o.DNS.Build(reg, "agent", o.DNS.Fallback, o.Max)
		if err != nil {
			return nil, err
		}
		sources = append(sources, cache)
	}
	if o.Leases.Enabled {
		rc, err := kubeclient.Config(kube)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("--count-server-leases: %w", err)
		}
		leases, err := o.Leases.Build(rc, reg)
		if err != nil {
			closeAll()
			return nil, err
		}
		sources = append(sources, leases)
	}
	switch len(sources) {
	case 0:
		return nil, nil
	case 1:
		return sources[0], nil
	}
	return &maxOf{MaxCounter: servercounter.NewMaxCounter(sources[0], sources[1]), sources: sources}, nil
}

// Counts reports whether o enables a source of the agent's own, which
// Build builds.
func (o *AgentOptions) Counts() bool { return o.DNS.Enabled() || o.Leases.Enabled }

// maxOf is the larger of two sources, closing both.
type maxOf struct {
	*servercounter.MaxCounter
	sources []Counter
}

// Close closes the MaxCounter, then its sources.
func (m *maxOf) Close() error {
	err := m.MaxCounter.Close()
	for _, s := range slices.Backward(m.sources) {
		_ = s.Close() // the counters' Close does not fail
	}
	return err
}
