// Package metric builds and registers the Prometheus collectors of the
// proxy-server, the proxy-agent and the features they share, so that
// each states only its metrics' names, HELP texts, labels and buckets.
package metric

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector of cs with reg; a nil reg registers
// nothing, for a component built without a registry. It tries them all,
// so that the error, "register <what>: ...", has one cause for each
// collector refused, not only the first.
func Register(reg prometheus.Registerer, what string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("register %s: %w", what, err)
	}
	return nil
}

// Prefix builds collectors named <Namespace>_<Subsystem>_<name>, so that a
// list of metrics states each one's name, HELP, labels and buckets only.
type Prefix struct{ Namespace, Subsystem string }

// Counter returns a counter.
func (p Prefix) Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts(p.opts(name, help)))
}

// CounterVec returns a counter with labels.
func (p Prefix) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts(p.opts(name, help)), labels)
}

// Gauge returns a gauge.
func (p Prefix) Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(p.opts(name, help))
}

// GaugeVec returns a gauge with labels.
func (p Prefix) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(p.opts(name, help), labels)
}

// GaugeFunc returns a gauge whose value is f's at each scrape.
func (p Prefix) GaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(p.opts(name, help), f)
}

// Histogram returns a histogram; nil buckets are prometheus.DefBuckets.
func (p Prefix) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(p.histogramOpts(name, help, buckets))
}

// HistogramVec returns a histogram with labels; nil buckets are
// prometheus.DefBuckets.
func (p Prefix) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(p.histogramOpts(name, help, buckets), labels)
}

func (p Prefix) opts(name, help string) prometheus.GaugeOpts {
	return prometheus.GaugeOpts{Namespace: p.Namespace, Subsystem: p.Subsystem, Name: name, Help: help}
}

func (p Prefix) histogramOpts(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{Namespace: p.Namespace, Subsystem: p.Subsystem, Name: name, Help: help, Buckets: buckets}
}
