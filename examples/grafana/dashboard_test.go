package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJSONIsGenerated fails when servercount.json is not what the code
// generates: run `go run .` here (or `make dashboard`).
func TestJSONIsGenerated(t *testing.T) {
	want, err := dashboardJSON()
	require.NoError(t, err)
	got, err := os.ReadFile(output)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "servercount.json differs from the code: run `make dashboard`")
}

// TestQueriesNameKnownMetrics parses every query with Prometheus's own
// PromQL parser and checks that every metric it selects is one of
// docs/metrics.md (generated from the binaries), so that a renamed or
// removed metric cannot leave an empty panel behind.
func TestQueriesNameKnownMetrics(t *testing.T) {
	known := metricReference(t)
	require.Greater(t, len(known), 40, "docs/metrics.md lists too few metrics")
	b, err := os.ReadFile(output)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &d))
	p := parser.NewParser(parser.Options{})
	titles := map[string]bool{}
	var queries int
	for _, panel := range d.Panels {
		if panel.Type == "row" {
			continue
		}
		assert.False(t, titles[panel.Title], "two panels are titled %q", panel.Title)
		titles[panel.Title] = true
		assert.NotEmpty(t, panel.Targets, "%q has no query", panel.Title)
		for _, target := range panel.Targets {
			queries++
			// Grafana's own variables, as it would fill them in.
			expr := strings.ReplaceAll(target.Expr, "$__rate_interval", "5m")
			e, err := p.ParseExpr(expr)
			if !assert.NoError(t, err, "%q: %s", panel.Title, target.Expr) {
				continue
			}
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				assert.True(t, selectsKnown(vs, known), "%q selects no metric of docs/metrics.md: %s", panel.Title, vs)
				return nil
			})
		}
	}
	assert.Greater(t, queries, 20)
}

// selectsKnown reports whether vs selects at least one known metric, and
// none that is unknown when it names one.
func selectsKnown(vs *parser.VectorSelector, known map[string]bool) bool {
	if vs.Name != "" {
		return known[vs.Name] || known[histogramBase(vs.Name)]
	}
	for _, m := range vs.LabelMatchers {
		if m.Name != model.MetricNameLabel {
			continue
		}
		for name := range known {
			if m.Matches(name) {
				return true
			}
		}
	}
	return false
}

var histogramSeries = regexp.MustCompile(`_(bucket|sum|count)$`)

// histogramBase is a histogram's name for one of its series' names.
func histogramBase(name string) string { return histogramSeries.ReplaceAllString(name, "") }

// metricReference reads the metric names of docs/metrics.md.
func metricReference(t *testing.T) map[string]bool {
	f, err := os.Open(filepath.Join("..", "..", "docs", "metrics.md"))
	require.NoError(t, err)
	defer f.Close()
	names := map[string]bool{}
	row := regexp.MustCompile("^\\| `([a-z_:]+)` \\|")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			names[m[1]] = true
		}
	}
	require.NoError(t, sc.Err())
	return names
}
