package main

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/explain"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
	"github.com/servercount/servercount/test/upstream"
)

// Both binaries export upstream's metrics under konnectivity_network_proxy_*
// with upstream's names, types, labels, HELP texts and buckets, and no
// other; a labelled series appears only once it happened, as upstream's
// do. The binaries run as processes, carry a tunnel and see a failed dial,
// so that the labelled series exist to be checked.
func TestMetricsMatchUpstream(t *testing.T) {
	certs, apiserver := newCredentials(t)
	_, sp := startServer(t, serverTLS(certs)...)
	serverMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", sp[2])
	// Before the agent: every unlabelled series upstream has exists at
	// start-up, and no labelled one.
	proctest.RequireStatus(t, serverMetrics, http.StatusOK, 20*time.Second)
	checkStartUp(t, "server", serverMetrics)

	_, healthPort := startAgent(t, append([]string{"--proxy-server-host=localhost", port("proxy-server-port", sp[1])}, agentTLS(certs)...)...)
	agentMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", healthPort)
	checkStartUp(t, "agent", agentMetrics)
	waitReady(t, healthPort, "agent ready")

	// A tunnel, and a dial that fails.
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	defer target.Close()
	frontend := churn.ConnectOverTLS(fmt.Sprintf("127.0.0.1:%d", sp[0]), apiserver)
	host := strings.TrimPrefix(target.URL, "http://")
	conn, err := frontend(t.Context(), host)
	require.NoError(t, err)
	require.Equal(t, "ok", getThrough(t, conn, host))
	conn.Close()
	closed := fmt.Sprintf("127.0.0.1:%d", nettest.FreePorts(t, 1)[0])
	_, err = frontend(t.Context(), closed)
	// The server answers the CONNECT, with a status other than 200.
	require.Error(t, err)
	require.Regexp(t, `^CONNECT `+regexp.QuoteMeta(closed)+`: [0-9]{3} `, err.Error())

	happened := []string{
		"konnectivity_network_proxy_server_grpc_connections", "konnectivity_network_proxy_server_ready_backends",
		"konnectivity_network_proxy_server_dial_failure_count", "konnectivity_network_proxy_server_stream_packets_total",
		"konnectivity_network_proxy_agent_endpoint_dial_failure_total", "konnectivity_network_proxy_agent_stream_packets_total",
	}
	for _, b := range []struct{ name, url string }{{"server", serverMetrics}, {"agent", agentMetrics}} {
		families := scrapeFamilies(t, b.url)
		for _, m := range upstream.Metrics {
			if m.Binary != b.name {
				continue
			}
			mf, ok := families[m.Name]
			if !ok {
				// Series that need what this test does not do (leases, a
				// full channel, a stream error) may be absent; those a
				// tunnel and a failed dial make may not.
				if len(m.Labels) == 0 || slices.Contains(happened, m.Name) {
					t.Errorf("%s: %s missing", b.name, m.Name)
				}
				continue
			}
			assert.Equal(t, m.Type, strings.ToLower(mf.GetType().String()), "%s type", m.Name)
			assert.Equal(t, m.Help, mf.GetHelp(), "%s HELP", m.Name)
			for _, s := range mf.GetMetric() {
				var labels []string
				for _, l := range s.GetLabel() {
					labels = append(labels, l.GetName())
				}
				assert.ElementsMatch(t, m.Labels, labels, "%s labels", m.Name)
				if m.Type == "histogram" {
					var bounds []float64
					for _, bk := range s.GetHistogram().GetBucket() {
						if !math.IsInf(bk.GetUpperBound(), 1) {
							bounds = append(bounds, bk.GetUpperBound())
						}
					}
					want := m.Buckets
					if want == nil {
						want = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
					}
					assert.Equal(t, want, bounds, "%s buckets", m.Name)
				}
			}
		}
		for name := range families {
			if strings.HasPrefix(name, "konnectivity_network_proxy_") {
				assert.True(t, slices.ContainsFunc(upstream.Metrics, func(m upstream.Metric) bool { return m.Name == name }),
					"%s: %s is not upstream's: ours go under servercount_*", b.name, name)
			}
		}
	}
}

// checkStartUp checks what a binary exports before anything happened:
// every unlabelled upstream metric, and no labelled series of upstream's
// (upstream creates those when they first happen).
func checkStartUp(t *testing.T, binary, url string) {
	t.Helper()
	families := scrapeFamilies(t, url)
	for _, m := range upstream.Metrics {
		if m.Binary != binary {
			continue
		}
		mf, ok := families[m.Name]
		if len(m.Labels) == 0 {
			assert.True(t, ok, "%s: %s exists from start-up", binary, m.Name)
			continue
		}
		if ok {
			for _, s := range mf.GetMetric() {
				t.Errorf("%s: series %s%v exists before anything happened", binary, m.Name, s.GetLabel())
			}
		}
	}
}

// scrapeFamilies reads the metric families at url.
func scrapeFamilies(t *testing.T, url string) explain.Metrics {
	t.Helper()
	m, err := explain.Parse(strings.NewReader(get(t, url)))
	require.NoError(t, err)
	return m
}
