package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// A DNS server that lies 100000 records never makes the agent aim for, or
// hold, more than ServerCountMax servers (counts are clamped by
// --server-count-max whatever their source). Five servers are reachable
// behind the balancer, so an agent that believed DNS would hold five.
func TestLyingDNSCountCappedByServerCountMax(t *testing.T) {
	const (
		lie     = 100000
		servers = 5
		max     = 3
	)
	cfg, liar, addrs := serversBehindLiar(t)
	liar.Claim(srvName, lie, addrs...)
	// The answer is 64 KiB over TCP after a truncated one over UDP: under
	// the race detector on a loaded machine that can take longer than a
	// short query timeout, which is not what this test is about.
	counter := cachedDNSCounter(t, liar.Addr(), waitFor)
	res, err := counter.Count(t.Context())
	require.NoError(t, err)
	require.Greater(t, res.Count, servers, "the lie did not reach the counter: %+v", res)

	a := startCountingAgent(t, cfg, counter, max)
	a.waitSyncRounds(t, 20)
	assert.Equal(t, max, a.Target())
	assert.Equal(t, max, a.Connected(), "servers held")
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_known_server_count")
	assert.Equal(t, float64(max), v)
}

// A DNS server whose answer flaps between one server and 100000 never
// takes the agent past ServerCountMax either, at any step of the flapping.
func TestFlappingDNSNeverExceedsServerCountMax(t *testing.T) {
	const max = 3
	cfg, liar, addrs := serversBehindLiar(t)
	counts := []int{100000, 1}
	liar.Flap(srvName, counts, addrs...)
	counter := cachedDNSCounter(t, liar.Addr(), waitFor)

	a := startCountingAgent(t, cfg, counter, max)
	for flip := range 6 {
		i := liar.Flip()
		// The agent has seen the new answer, and a few rounds have run
		// with it.
		require.Eventually(t, func() bool {
			n := counter.CountServers()
			return (counts[i] == 1) == (n == 1)
		}, waitFor, tick, "flip %d: the counter never saw %d records", flip, counts[i])
		a.waitSyncRounds(t, 5)
		assert.LessOrEqual(t, a.Target(), max, "flip %d", flip)
		assert.LessOrEqual(t, a.Connected(), max, "flip %d", flip)
	}
}

// A server that says serverCount 1e9 and gives every stream a new server
// ID, as a hostile server once did (7368 connections in
// 20 s), gets ServerCountMax streams and no more.
func TestNewServerIDPerStreamGetsServerCountMaxStreams(t *testing.T) {
	const max = 3
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "liar", NewIDPerStream: true, Count: "1000000000"})
	cfg := testConfig(tt, srv.Addr())
	cfg.Counter = servercounter.StaticServerCounter(1)
	cfg.TargetPolicy = TargetMax
	cfg.ServerCountMax = max
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == max }, waitFor, tick)
	opened := srv.Opened()
	a.waitSyncRounds(t, 20)
	assert.Equal(t, opened, srv.Opened(), "streams opened once the target was reached")
	assert.Equal(t, int64(max), opened)
	assert.Equal(t, max, a.Connected())
	assert.Equal(t, max, a.Target())
}

// serversBehindLiar starts five servers behind a balancer, and a DNS
// server for the test to make lie about them; cfg is an agent's
// testConfig for the balancer.
func serversBehindLiar(t *testing.T) (cfg Config, liar *adversarytest.LyingDNS, addrs []string) {
	t.Helper()
	tt := newTestTLS(t)
	for _, id := range []string{"s0", "s1", "s2", "s3", "s4"} {
		addrs = append(addrs, newTestServer(t, tt, adversarytest.ServerConfig{ID: id, Count: "1"}).Addr())
	}
	lb := newTestLB(t, addrs...)
	return testConfig(tt, lb.Addr()), adversarytest.StartLyingDNS(t), addrs
}

// startCountingAgent starts an agent from cfg that aims for counter's
// count, capped at maxCount, and waits until it holds maxCount servers.
func startCountingAgent(t *testing.T, cfg Config, counter *servercounter.CachedServerCounter, maxCount int) *testAgent {
	t.Helper()
	cfg.TargetPolicy = TargetCounted
	cfg.Counter = counter
	cfg.ServerCountMax = maxCount
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == maxCount }, waitFor, tick)
	return a
}

// cachedDNSCounter is a cached DNS counter of srvName at the DNS server
// dnsAddr, refreshed in the background as --server-count-dns builds it.
func cachedDNSCounter(t *testing.T, dnsAddr string, timeout time.Duration) *servercounter.CachedServerCounter {
	t.Helper()
	dc, err := servercounter.NewDNSServerCounter(servercounter.Config{Name: srvName, Servers: []string{dnsAddr}, Timeout: timeout})
	require.NoError(t, err)
	cache, err := servercounter.NewCachedServerCounter(dc, servercounter.CacheConfig{Expiry: 20 * time.Millisecond, MinExpiry: 10 * time.Millisecond, ExactExpiry: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cache.Close() })
	return cache
}
