package docgen

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "write the references in docs/ again")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// assertCurrent checks that docs/name holds got, the reference the code
// generates; with -update it writes got there instead.
func assertCurrent(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("..", "..", "docs", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run `make docs`")
	assert.Equal(t, string(want), string(got), "docs/%s differs from the code: run `make docs`", name)
}

// TestFlagsReferenceIsCurrent fails when docs/flags.md is not what the
// code generates: a flag added, renamed or given another default without
// `make docs`.
func TestFlagsReferenceIsCurrent(t *testing.T) {
	var got bytes.Buffer
	require.NoError(t, WriteFlags(&got, Binaries()))
	assertCurrent(t, "flags.md", got.Bytes())
}

// TestFlagsReferenceIsStable: two generations are the same, so that no
// default taken from the environment or at random (an ID) lands in the
// reference.
func TestFlagsReferenceIsStable(t *testing.T) {
	var a, b bytes.Buffer
	require.NoError(t, WriteFlags(&a, Binaries()))
	require.NoError(t, WriteFlags(&b, Binaries()))
	assert.Equal(t, a.String(), b.String())
	for _, bin := range Binaries() {
		n := 0
		bin.Flags.VisitAll(func(*pflag.Flag) { n++ })
		assert.Greater(t, n, 5, "%s: too few flags", bin.Name)
	}
}

// TestMetricsReferenceIsCurrent fails when docs/metrics.md is not what
// the code generates: a metric added, renamed or explained otherwise
// without `make docs`.
func TestMetricsReferenceIsCurrent(t *testing.T) {
	ms, err := Metrics(t.TempDir())
	require.NoError(t, err)
	var got bytes.Buffer
	require.NoError(t, WriteMetrics(&got, ms))
	assertCurrent(t, "metrics.md", got.Bytes())
}

// TestMetricsCoverEveryFeature: the reference holds the metrics of each
// feature the generator turns on, so that a feature whose wiring stops
// registering them on the given registerer is noticed.
func TestMetricsCoverEveryFeature(t *testing.T) {
	ms, err := Metrics(t.TempDir())
	require.NoError(t, err)
	names := func(bin string) []string {
		var out []string
		for _, m := range ms[bin] {
			out = append(out, m.Name)
		}
		return out
	}
	for bin, want := range map[string][]string{
		"proxy-server": {
			"konnectivity_network_proxy_server_ready_backend_connections",
			"servercount_server_dns_lookups_total",
			"servercount_server_token_reviews_total",
			"konnectivity_network_proxy_server_lease_list_total",
			"servercount_server_http_open_connections",
			"servercount_build_info",
		},
		"proxy-agent": {
			"konnectivity_network_proxy_agent_open_server_connections",
			"konnectivity_network_proxy_agent_server_connection_failure_count",
			"servercount_agent_dns_lookups_total",
			"konnectivity_network_proxy_agent_lease_lists_total",
			"servercount_build_info",
		},
	} {
		assert.Subset(t, names(bin), want, bin)
	}
}
