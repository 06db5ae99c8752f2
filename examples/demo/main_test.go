package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestDemoFollowsScaling runs the whole demo: the agent must follow
// 3 -> 5 -> 2 servers, spending one dial per server, and a request must
// pass through every server at each step.
func TestDemoFollowsScaling(t *testing.T) {
	var out strings.Builder
	chartPath := filepath.Join(t.TempDir(), "demo.png")
	require.NoError(t, run(t.Context(), &out, chartPath))
	f, err := os.Open(chartPath)
	require.NoError(t, err, "the chart")
	defer f.Close()
	_, err = png.DecodeConfig(f)
	require.NoError(t, err, "the chart is a PNG")
	got := out.String()
	for _, want := range []string{
		"agent: counts 3 servers (source dns), holds 3 connections, 3 dials so far (0 duplicates, 0 failed)",
		"agent: counts 5 servers (source dns), holds 5 connections, 5 dials so far (0 duplicates, 0 failed)",
		"agent: counts 2 servers (source dns), holds 2 connections, 5 dials so far (0 duplicates, 0 failed)",
		"via proxy-server 127.0.0.6 -> \"hello from the cluster\"",
		"done: every server, the agent and the DNS server are stopped",
	} {
		assert.Contains(t, got, want)
	}
	assert.Equal(t, 3+5+2, strings.Count(got, `-> "hello from the cluster"`), got)
}
