// Package chart draws the pictures the demo and the benchmarks write
// beside their tables, as PNG files, with gonum/plot: counts and
// connections over time, and distributions of latencies.
package chart

import (
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one line: a name for the legend and its points.
type Series struct {
	Name   string
	Points []Point
}

// Point is one sample.
type Point struct{ X, Y float64 }

// Mark is a labelled moment on a timeline, drawn as a vertical line.
type Mark struct {
	X     float64
	Label string
}

// Panel is one plot of a figure.
type Panel struct {
	Title, XLabel, YLabel string
	Series                []Series
	Marks                 []Mark
	// LogX draws the X axis on a log scale (latencies).
	LogX bool
}

// colors are the lines' colours, in order: distinct for the colour-blind
// (Okabe and Ito's palette).
var colors = []color.Color{
	color.RGBA{0, 114, 178, 255},   // blue
	color.RGBA{213, 94, 0, 255},    // vermillion
	color.RGBA{0, 158, 115, 255},   // green
	color.RGBA{204, 121, 167, 255}, // purple
	color.RGBA{230, 159, 0, 255},   // orange
	color.RGBA{86, 180, 233, 255},  // sky blue
}

// WritePNG draws panels side by side into a PNG file at path, each
// width by height.
func WritePNG(path string, width, height vg.Length, panels ...Panel) error {
	plots := [][]*plot.Plot{make([]*plot.Plot, len(panels))}
	for i, pn := range panels {
		p, err := build(pn)
		if err != nil {
			return fmt.Errorf("chart %q: %w", pn.Title, err)
		}
		plots[0][i] = p
	}
	img := vgimg.New(width*vg.Length(len(panels)), height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for i, p := range plots[0] {
		p.Draw(canvases[0][i])
	}
	png := vgimg.PngCanvas{Canvas: img}
	if err := savePNG(path, png); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func build(pn Panel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.Title
	p.X.Label.Text, p.Y.Label.Text = pn.XLabel, pn.YLabel
	// Bottom right: where timelines that start at zero and distributions
	// that rise to the right leave room.
	p.Legend.Top, p.Legend.Left = false, false
	p.Add(plotter.NewGrid())
	if pn.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, s := range pn.Series {
		xys := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			xys[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		line.Color = colors[i%len(colors)]
		line.Width = vg.Points(1.5)
		if i > 0 {
			line.Dashes = []vg.Length{vg.Points(float64(2 + i)), vg.Points(2)}
		}
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	// Room above the data for the marks' labels.
	top := p.Y.Max + 0.25*(p.Y.Max-p.Y.Min)
	for i, m := range pn.Marks {
		if err := addMark(p, m, top, i); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// addMark draws m as a grey vertical line up to top, with its label near
// the top; the i-th mark's label is a step lower than the one before, so
// that marks close together stay readable.
func addMark(p *plot.Plot, m Mark, top float64, i int) error {
	line, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: p.Y.Min}, {X: m.X, Y: top}})
	if err != nil {
		return err
	}
	line.Color = color.Gray{Y: 150}
	line.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
	p.Add(line)
	y := top - float64(i%3)*0.07*(top-p.Y.Min)
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: m.X, Y: y}}, Labels: []string{" " + m.Label}})
	if err != nil {
		return err
	}
	labels.Offset = vg.Point{Y: -vg.Points(10)}
	p.Add(labels)
	return nil
}

// CDF is the empirical distribution of samples: for each sample, in
// order, the fraction of samples at or below it.
func CDF(samples []float64) []Point {
	s := slices.Clone(samples)
	slices.Sort(s)
	pts := make([]Point, len(s))
	for i, v := range s {
		pts[i] = Point{X: v, Y: float64(i+1) / float64(len(s))}
	}
	return pts
}
