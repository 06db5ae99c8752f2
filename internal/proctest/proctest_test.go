package proctest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A scrape as a server exposes it: a counter, a labelled gauge and a
// histogram, which the e2e suites read by its _count.
func TestParseReadsCountersGaugesAndHistogramCounts(t *testing.T) {
	const text = `# TYPE dials_total counter
dials_total 3
# TYPE target gauge
target{source="dns"} 2
target{source="static"} 1
# TYPE dial_seconds histogram
dial_seconds_bucket{le="0.1"} 4
dial_seconds_bucket{le="+Inf"} 5
dial_seconds_sum 0.75
dial_seconds_count 5
`
	m, err := Parse(strings.NewReader(text))
	require.NoError(t, err)
	assert.Equal(t, 3.0, m.Sum("dials_total"))
	v, ok := m.Value("target", "source", "dns")
	assert.True(t, ok)
	assert.Equal(t, 2.0, v)
	assert.Equal(t, 3.0, m.Sum("target"))
	assert.Equal(t, 5.0, m.Sum("dial_seconds_count"))
	assert.Equal(t, 0.75, m.Sum("dial_seconds_sum"))
	_, ok = m.Value("dial_seconds")
	assert.False(t, ok, "a histogram is read by its _count and _sum")
}
