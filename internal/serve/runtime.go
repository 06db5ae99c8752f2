package serve

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/internal/version"
)

// RegisterRuntime registers on reg what every binary exports beside its
// own metrics: the Go runtime's and the process's standard collectors
// (go_*, process_*) and the build's version.
func RegisterRuntime(reg prometheus.Registerer) error {
	return metric.Register(reg, "runtime metrics", collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
}
