package agent

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/logtest"
)

// runLogged runs a ClientSet from cfg with a level-0 logger writing to the
// returned buffer, until the test ends.
func runLogged(t *testing.T, cfg Config) (*testAgent, *logtest.Buffer) {
	t.Helper()
	logger, logs := logtest.NewLogger(0)
	a := newAgent(t, cfg)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return a, logs
}

// failedOnce asserts that logs holds one failure to connect, however
// many dials failed, and returns the log.
func failedOnce(t *testing.T, logs *logtest.Buffer) string {
	t.Helper()
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "Failed to connect to proxy-server"), out)
	return out
}

// recovered waits until a is ready and has logged its recovery, and
// asserts that the failure before it was still logged only once.
func recovered(t *testing.T, a *testAgent, logs *logtest.Buffer) {
	t.Helper()
	require.Eventually(t, a.Ready, waitFor, tick)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "Recovered: connect to proxy-server succeeded again")
	}, waitFor, tick)
	failedOnce(t, logs)
}

// An agent whose server port is refused says so at the default level,
// once however often it retries, and says when it has recovered (issue
// 10, item 12).
func TestRefusedServerPortLoggedOnceAtLevelZero(t *testing.T) {
	tt := newTestTLS(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // refused from here on

	a, logs := runLogged(t, testConfig(tt, addr))
	a.waitSyncRounds(t, 10)
	out := failedOnce(t, logs)
	assert.Contains(t, out, "connection refused")
	assert.Contains(t, out, addr)
	assert.NotContains(t, out, "Recovered")

	// The port comes alive: the agent connects and says it recovered.
	lis, err = net.Listen("tcp", addr)
	require.NoError(t, err)
	newTestServerOn(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"}, lis)
	recovered(t, a, logs)
}

// A server whose certificate the agent's CA did not sign is a failure the
// operator must see without -v, once, and its end too.
func TestWrongCALoggedOnceAtLevelZero(t *testing.T) {
	trusted, other := newTestTLS(t), newTestTLS(t)
	wrong := newTestServer(t, other, adversarytest.ServerConfig{ID: "wrong", Count: "1"})
	right := newTestServer(t, trusted, adversarytest.ServerConfig{ID: "right", Count: "1"})
	lb := newTestLB(t, wrong.Addr())

	a, logs := runLogged(t, testConfig(trusted, lb.Addr()))
	a.waitSyncRounds(t, 10)
	out := failedOnce(t, logs)
	assert.Contains(t, out, "certificate signed by unknown authority")

	lb.SetBackends(right.Addr())
	recovered(t, a, logs)
}

// Behind a load balancer with one good and one bad server, dials fail and
// land on the good server in turn: the failure is logged once, not once
// per dial, and a duplicate of the good server does not end it (nor
// start it again, within outage.DefaultQuiet).
func TestOneBadServerBehindBalancerLoggedOnce(t *testing.T) {
	trusted, other := newTestTLS(t), newTestTLS(t)
	good := newTestServer(t, trusted, adversarytest.ServerConfig{ID: "good", Count: "2"})
	bad := newTestServer(t, other, adversarytest.ServerConfig{ID: "bad", Count: "2"})
	lb := newTestLB(t, good.Addr(), bad.Addr())

	a, logs := runLogged(t, testConfig(trusted, lb.Addr()))
	require.Eventually(t, a.Ready, waitFor, tick)
	// Enough rounds for both kinds of dial, many times over.
	require.Eventually(t, func() bool {
		dup, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "duplicate")
		failed, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
		return dup >= 3 && failed >= 3
	}, waitFor, tick)
	out := failedOnce(t, logs)
	// Only the first connection to the good server, if a failed dial came
	// before it, is a recovery: its duplicates are not.
	assert.LessOrEqual(t, strings.Count(out, "Recovered"), 1, out)
}
