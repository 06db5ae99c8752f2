package metric

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A component built without a registry registers nothing and fails
// nothing.
func TestRegisterNil(t *testing.T) {
	p := Prefix{Namespace: "ns", Subsystem: "sub"}
	require.NoError(t, Register(nil, "test metrics", p.Counter("c", "help")))
}

// A second component on the same registry is refused with the caller's
// context and one cause for each collector refused, not only the first.
func TestRegisterNamesEveryClash(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := Prefix{Namespace: "ns", Subsystem: "sub"}
	build := func() []prometheus.Collector {
		return []prometheus.Collector{p.Counter("a_total", "A."), p.GaugeVec("b", "B.", "l")}
	}
	require.NoError(t, Register(reg, "test metrics", build()...))
	err := Register(reg, "test metrics (twice?)", build()...)
	require.ErrorContains(t, err, "register test metrics (twice?): ")
	var are prometheus.AlreadyRegisteredError
	assert.ErrorAs(t, err, &are)
	joined, ok := errors.Unwrap(err).(interface{ Unwrap() []error })
	require.True(t, ok, "not joined: %v", err)
	assert.Len(t, joined.Unwrap(), 2)
}

// Prefix names each collector namespace_subsystem_name, with its HELP,
// labels and buckets.
func TestPrefix(t *testing.T) {
	p := Prefix{Namespace: "ns", Subsystem: "sub"}
	h := p.HistogramVec("h_seconds", "H.", []float64{1, 2}, "code")
	h.WithLabelValues("200").Observe(1.5)
	reg := prometheus.NewRegistry()
	require.NoError(t, Register(reg, "test metrics", h, p.GaugeFunc("f", "F.", func() float64 { return 7 })))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 2)
	f, hist := mfs[0], mfs[1]
	assert.Equal(t, "ns_sub_f", f.GetName())
	assert.Equal(t, "F.", f.GetHelp())
	assert.Equal(t, 7.0, f.GetMetric()[0].GetGauge().GetValue())
	assert.Equal(t, "ns_sub_h_seconds", hist.GetName())
	assert.Equal(t, "code", hist.GetMetric()[0].GetLabel()[0].GetName())
	buckets := hist.GetMetric()[0].GetHistogram().GetBucket()
	require.Len(t, buckets, 2)
	assert.Equal(t, []float64{1, 2}, []float64{buckets[0].GetUpperBound(), buckets[1].GetUpperBound()})
}
