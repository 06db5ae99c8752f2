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

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/explain"
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
func fleet(t *testing.T, count int) (serverURL, agentURL string) {
	env := proxytest.NewEnv(t, "explain")
	srv := proxytest.StartServer(t, env, proxytest.ServerOptions{ID: "s1"})
	cfg := proxytest.FastAgentConfig("a1", srv.AgentAddr())
	cfg.Counter, cfg.TargetPolicy = servercounter.StaticServerCounter(count), agent.TargetCounted
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

	r, err = read(t, serverURL)
	require.NoError(t, err)
	assert.Equal(t, explain.Server, r.Kind)
	assert.Contains(t, strings.Join(r.Facts, "\n"), "1 agent stream(s) connected.")
	assert.True(t, r.Healthy(), "problems: %q", r.Problems)
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
