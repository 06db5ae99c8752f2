package app_test

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/proxytest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

func runExplain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	var out, errOut strings.Builder
	code = app.Run(t.Context(), append([]string{"explain"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// `servercount explain` of a real agent that holds 1 of the 3 servers it
// counts exits 1 and names the problem, as text and as JSON; of its
// server, which has its agent, exits 0; of nothing, 2; misused, 64.
func TestExplainExitCodes(t *testing.T) {
	env := proxytest.NewEnv(t, "explain")
	srv := proxytest.StartServer(t, env, proxytest.ServerOptions{ID: "s1"})
	cfg := proxytest.FastAgentConfig("a1", srv.AgentAddr())
	cfg.Counter, cfg.TargetPolicy = servercounter.StaticServerCounter(3), agent.TargetCounted
	a := proxytest.StartAgent(t, env, cfg)
	hs := httptest.NewServer(promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{}))
	defer hs.Close()
	require.Eventually(t, func() bool { return a.ClientSet().Connected() == 1 }, 10*time.Second, 10*time.Millisecond)

	code, out, _ := runExplain(t, strings.TrimPrefix(hs.URL, "http://"))
	assert.Equal(t, app.ExitExplainProblems, code, out)
	assert.Contains(t, out, "PROBLEM: 2 proxy-server(s) missing")

	code, out, _ = runExplain(t, "--json", hs.URL)
	assert.Equal(t, app.ExitExplainProblems, code)
	var r struct {
		Kind     string
		Problems []string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	assert.Equal(t, "proxy-agent", r.Kind)
	assert.NotEmpty(t, r.Problems)

	code, out, _ = runExplain(t, srv.HealthURL())
	assert.Equal(t, app.ExitExplainHealthy, code, out)
	assert.Contains(t, out, "Nothing is failing.")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := l.Addr().String()
	l.Close()
	code, _, errOut := runExplain(t, "--timeout=2s", nobody)
	assert.Equal(t, app.ExitExplainUnreadable, code)
	assert.Contains(t, errOut, "connection refused")

	code, _, errOut = runExplain(t)
	assert.Equal(t, app.ExitUsage, code)
	assert.Contains(t, errOut, "give one URL")

	code, _, errOut = runExplain(t, "ftp://10.0.0.5/metrics")
	assert.Equal(t, app.ExitUsage, code)
	assert.Contains(t, errOut, "invalid URL")
}
