// Package metricstest reads metric values from a Prometheus registry, for
// tests that assert on what the binaries export, and the heap in use and
// the goroutines in a function, for tests of what a process holds.
package metricstest

import (
	"runtime"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the gauge or counter series named name whose
// labels include labels (name, value pairs), or a histogram's number of
// observations, and whether there is one.
func Value(g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == kv[i] && l.GetValue() == kv[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// HeapInUse collects garbage and returns the bytes of the heap in use
// after it: what a test still holds, for before-and-after comparisons.
func HeapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// GoroutinesIn counts the goroutines of this process whose stack holds
// fn, a function's full name as a stack trace prints it, for example
// "github.com/servercount/servercount/pkg/agent.(*tunnel).readLoop".
func GoroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn+"(")
		}
		buf = make([]byte, 2*len(buf))
	}
}
