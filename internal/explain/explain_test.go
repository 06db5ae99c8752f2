package explain_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/explain"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proxytest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func read(t *testing.T, url string) (*explain.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	return explain.Read(ctx, &http.Client{Transport: tr}, url)
}

// fleet is one real proxy-server and one real agent (pkg/server and
// pkg/agent over real gRPC and TLS) whose agent counts 3 servers where
// only one exists, with the agent's metrics served over HTTP.
func fleet(t *testing.T, count int, change ...func(*agent.Config)) (serverURL, agentURL string) {
	env := proxytest.NewEnv(t, "explain")
	srv := proxytest.StartServer(t, env, proxytest.ServerOptions{ID: "s1"})
	cfg := proxytest.FastAgentConfig("a1", srv.AgentAddr())
	cfg.Counter, cfg.TargetPolicy = servercounter.StaticServerCounter(count), agent.TargetCounted
	for _, c := range change {
		c(&cfg)
	}
	a := proxytest.StartAgent(t, env, cfg)
	hs := httptest.NewServer(promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{}))
	t.Cleanup(hs.Close)
	require.Eventually(t, func() bool { return a.ClientSet().Connected() == 1 }, 10*time.Second, 10*time.Millisecond)
	return srv.HealthURL(), hs.URL
}

// An agent that counts 3 servers and holds the only one there is: the
// report says what it holds, where its target comes from, and that two
// are missing.
func TestAgentMissingServers(t *testing.T) {
	serverURL, agentURL := fleet(t, 3)
	r, err := read(t, agentURL)
	require.NoError(t, err)
	assert.Equal(t, explain.Agent, r.Kind)
	assert.Equal(t, agentURL+"/metrics", r.URL)
	text := strings.Join(r.Facts, "\n")
	assert.Contains(t, text, "Holds 1 of the 3 proxy-servers it aims for; the target comes from a static count.")
	assert.Contains(t, text, "Connect dials to proxy-servers since start:")
	assert.False(t, r.Healthy())
	assert.Contains(t, strings.Join(r.Problems, "\n"), "2 proxy-server(s) missing")

	// The agent keeps dialing for the two servers it misses, and each
	// dial is a second stream on the one server until the agent sees the
	// serverID it already holds and closes it: the server's count is 2
	// for those moments.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		r, err := read(t, serverURL)
		require.NoError(c, err)
		assert.Equal(c, explain.Server, r.Kind)
		assert.Contains(c, strings.Join(r.Facts, "\n"), "1 agent stream(s) connected.")
		assert.True(c, r.Healthy(), "problems: %q", r.Problems)
	}, 10*time.Second, 20*time.Millisecond)
}

// With --readiness-all-servers, an agent that has missed counted servers
// past the grace period is not ready, and the report says so and for how
// long they have been missing.
func TestAgentNotReady(t *testing.T) {
	_, agentURL := fleet(t, 3, func(c *agent.Config) { c.ReadyWhenAll = true })
	r := explainEventually(t, agentURL, "Not ready (/readyz fails)")
	assert.Regexp(t, `2 proxy-server\(s\) missing for \d+s`, strings.Join(r.Problems, "\n"))
}

// An agent that holds what it counts is healthy, and the text says so.
func TestHealthyAgent(t *testing.T) {
	_, agentURL := fleet(t, 1)
	r, err := read(t, agentURL)
	require.NoError(t, err)
	assert.True(t, r.Healthy(), "problems: %q", r.Problems)
	var b strings.Builder
	require.NoError(t, r.WriteText(&b))
	assert.Contains(t, b.String(), "proxy-agent at "+agentURL+"/metrics")
	assert.Contains(t, b.String(), "Nothing is failing.")
}

// Nothing to explain: no answer, an HTTP error, a page that is not
// metrics, and metrics of another program each give one error saying so.
func TestUnreadable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	l.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/html", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "<html>{not metrics</html>") })
	mux.HandleFunc("/other", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE up gauge\nup 1\n")
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	for url, want := range map[string]string{
		closed:              "connection refused",
		hs.URL + "/missing": "404",
		hs.URL + "/html":    "not Prometheus metrics",
		hs.URL + "/other":   "neither a proxy-agent's nor a proxy-server's metrics",
	} {
		_, err := read(t, url)
		if assert.Error(t, err, url) {
			assert.Contains(t, err.Error(), want, url)
		}
	}
}

// dnsAgent is a real agent core counting servers through DNS as the
// binaries build it (internal/counting, its metrics on the agent's
// registry), with one real proxy-server, and its metrics served over
// HTTP. holdDown is the agent's.
func dnsAgent(t *testing.T, dnsAddr string, holdDown time.Duration) string {
	env := proxytest.NewEnv(t, "explain")
	srv := proxytest.StartServer(t, env, proxytest.ServerOptions{ID: "s1"})
	reg := prometheus.NewRegistry()
	o := counting.NewDNSOptions()
	o.Name, o.Servers = "proxy-server.example.", []string{dnsAddr}
	o.CacheTTL, o.CacheTTLMin = 50*time.Millisecond, 10*time.Millisecond
	cache, err := o.Build(reg, "agent", 1, servercounter.DefaultMax)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cache.Close() })
	cfg := proxytest.FastAgentConfig("a1", srv.AgentAddr())
	cfg.Counter, cfg.TargetPolicy = cache, agent.TargetCounted
	cfg.Registerer, cfg.HoldDown = reg, holdDown
	proxytest.StartAgent(t, env, cfg)
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// explainEventually reads url until the report has want among its facts
// or problems.
func explainEventually(t *testing.T, url, want string) *explain.Report {
	t.Helper()
	var r *explain.Report
	require.Eventually(t, func() bool {
		var err error
		r, err = read(t, url)
		return err == nil && strings.Contains(strings.Join(append(append([]string{}, r.Facts...), r.Problems...), "\n"), want)
	}, 20*time.Second, 20*time.Millisecond, "no %q in the report: %+v", want, r)
	return r
}

// An agent whose nameserver refuses every query: DNS is failing, and the
// agent has never learnt a count, so it uses the fallback.
func TestAgentWithFailingDNSOnTheFallback(t *testing.T) {
	url := dnsAgent(t, nettest.Refused(t, "127.0.0.1"), time.Second)
	r := explainEventually(t, url, "Every DNS lookup has failed since start")
	assert.Contains(t, strings.Join(r.Facts, "\n"), "the target comes from --fallback-server-count")
	assert.Contains(t, strings.Join(r.Problems, "\n"), "No server count has been learnt since the agent started")
	assert.Contains(t, strings.Join(r.Facts, "\n"), "network")
	explainEventually(t, url, "The last DNS lookup failed: the count backs off, the next lookup at ")
}

// DNS said 3, then 2: the agent keeps aiming for 3 during its hold-down,
// and the report says why it does not aim lower yet.
func TestAgentWithTheHoldDownPending(t *testing.T) {
	dns := dnstest.NewServer(t)
	records := func(ips ...string) {
		var rrs []mdns.RR
		for _, ip := range ips {
			rr, err := mdns.NewRR("proxy-server.example. 1 IN A " + ip)
			require.NoError(t, err)
			rrs = append(rrs, rr)
		}
		dns.SetRecords(rrs...)
	}
	records("10.0.0.1", "10.0.0.2", "10.0.0.3")
	url := dnsAgent(t, dns.Addr(), time.Hour)
	explainEventually(t, url, "Holds 1 of the 3 proxy-servers it aims for; the target comes from the DNS count")
	records("10.0.0.1", "10.0.0.2")
	r := explainEventually(t, url, "DNS now says 2, fewer than the target")
	assert.Contains(t, strings.Join(r.Facts, "\n"), "Holds 1 of the 3")
	assert.Contains(t, strings.Join(r.Problems, "\n"), "2 proxy-server(s) missing")
}

// The address an operator types becomes the metrics URL; what cannot be
// one gets one error saying what to give.
func TestMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5:8093":                       "http://10.0.0.5:8093/metrics",
		"http://10.0.0.5:8093":                "http://10.0.0.5:8093/metrics",
		"https://agent.example:8093/":         "https://agent.example:8093/metrics",
		"http://10.0.0.5:8095/custom/metrics": "http://10.0.0.5:8095/custom/metrics",
	} {
		got, err := explain.MetricsURL(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"ftp://10.0.0.5/metrics", "http://", "http://[::1"} {
		_, err := explain.MetricsURL(bad)
		if assert.Error(t, err, bad) {
			assert.Contains(t, err.Error(), "give the health or admin address", bad)
		}
	}
}
