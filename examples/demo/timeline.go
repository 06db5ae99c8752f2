package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/servercount/servercount/test/chart"
)

// timeline samples what the agent counts and holds while the demo runs,
// for its chart.
type timeline struct {
	start time.Time

	mu      sync.Mutex // guards the fields below
	samples []sample
	marks   []chart.Mark
}

type sample struct {
	at                           float64 // seconds since start
	target, connections, dnsSeen int
}

// sample scrapes url every interval until the returned func is called,
// which waits for the last scrape.
func (tl *timeline) sample(ctx context.Context, url string, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			m := scrape(url)
			tl.mu.Lock()
			tl.samples = append(tl.samples, sample{at: time.Since(tl.start).Seconds(), target: m.target, connections: m.connections, dnsSeen: m.dnsCount})
			tl.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// mark labels this moment.
func (tl *timeline) mark(label string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.marks = append(tl.marks, chart.Mark{X: time.Since(tl.start).Seconds(), Label: label})
}

// write draws the servers in DNS, the agent's target and the servers it
// holds over time into a PNG at path.
func (tl *timeline) write(path string) error {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	series := []chart.Series{{Name: "servers in DNS"}, {Name: "agent's target"}, {Name: "servers the agent holds"}}
	for _, s := range tl.samples {
		series[0].Points = append(series[0].Points, chart.Point{X: s.at, Y: float64(s.dnsSeen)})
		series[1].Points = append(series[1].Points, chart.Point{X: s.at, Y: float64(s.target)})
		series[2].Points = append(series[2].Points, chart.Point{X: s.at, Y: float64(s.connections)})
	}
	if err := chart.WritePNG(path, 7*vg.Inch, 4*vg.Inch, chart.Panel{
		Title:  "make demo: an agent counting proxy-servers through DNS",
		XLabel: "seconds", YLabel: "servers",
		Series: series, Marks: tl.marks,
	}); err != nil {
		return fmt.Errorf("the demo's chart: %w", err)
	}
	return nil
}
