package chart_test

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gonum.org/v1/plot/vg"

	"github.com/servercount/servercount/test/chart"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCDF(t *testing.T) {
	assert.Equal(t, []chart.Point{{X: 1, Y: 0.25}, {X: 2, Y: 0.5}, {X: 3, Y: 0.75}, {X: 5, Y: 1}}, chart.CDF([]float64{3, 1, 5, 2}))
	assert.Empty(t, chart.CDF(nil))
}

// Two panels side by side, one a timeline with marks, one a distribution
// on a log axis, make a PNG of twice the panel width.
func TestWritePNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.png")
	timeline := chart.Panel{
		Title: "counts", XLabel: "seconds", YLabel: "servers",
		Series: []chart.Series{{Name: "target", Points: []chart.Point{{X: 0, Y: 3}, {X: 1, Y: 5}, {X: 2, Y: 2}}}},
		Marks:  []chart.Mark{{X: 1, Label: "scale to 5"}},
	}
	dist := chart.Panel{
		Title: "latency", XLabel: "µs", YLabel: "fraction", LogX: true,
		Series: []chart.Series{{Name: "a", Points: chart.CDF([]float64{100, 200, 1000})}, {Name: "b", Points: chart.CDF([]float64{150, 300, 3000})}},
	}
	require.NoError(t, chart.WritePNG(path, 4*vg.Inch, 3*vg.Inch, timeline, dist))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	assert.Equal(t, 2*cfg.Height*4/3, cfg.Width, "two panels of 4x3 inches")
}
