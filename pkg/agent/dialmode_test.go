package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// srvName is the SRV name of the test servers' headless Service.
const srvName = "_agent._tcp.proxy.test.svc.cluster.local."

// dnsCounter serves addrs as the SRV records of srvName from a real DNS
// server, and returns a cached DNS counter of them that refreshes in the
// background, as --server-count-dns builds it, with the DNS server to
// change the records.
func dnsCounter(t *testing.T, addrs ...string) (*servercounter.CachedServerCounter, *dnstest.Server) {
	t.Helper()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.SRVRecords(srvName, addrs...)...)
	return cachedDNSCounter(t, srv.Addr(), time.Second), srv
}

func TestResolvedModeReachesEachServerInOneDial(t *testing.T) {
	tt := newTestTLS(t)
	var addrs []string
	for i := range 5 {
		s := newTestServer(t, tt, adversarytest.ServerConfig{ID: fmt.Sprintf("s%d", i), Count: "5"})
		addrs = append(addrs, s.Addr())
	}
	counter, dns := dnsCounter(t, addrs[:3]...)
	cfg := testConfig(tt, "127.0.0.1:1") // the load balancer is never needed
	cfg.DialMode, cfg.TargetPolicy = DialResolved, TargetCounted
	cfg.Counter = counter
	a := startAgent(t, cfg)

	require.Eventually(t, func() bool { return a.Connected() == 3 }, waitFor, tick, "3 servers")
	dials := func(result string) float64 {
		n, _ := a.metric(t, "servercount_agent_server_dials_total", "result", result)
		return n
	}
	assert.Equal(t, 3.0, dials("ok"))
	assert.Equal(t, 0.0, dials("duplicate"))
	assert.Equal(t, 0.0, dials("error"))

	// DNS shows two more: two more dials.
	dns.SetRecords(dnstest.SRVRecords(srvName, addrs...)...)
	require.Eventually(t, func() bool { return a.Connected() == 5 }, waitFor, tick, "5 servers")
	assert.Equal(t, 5.0, dials("ok"))
	assert.Equal(t, 0.0, dials("duplicate")+dials("error"))
}

func TestResolvedModeBacksOffOnUnreachableServers(t *testing.T) {
	tt := newTestTLS(t)
	s0 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s0", Count: "3"})
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "3"})
	// Three more listed that nobody serves: nothing listens on port 1.
	counter, _ := dnsCounter(t, s0.Addr(), s1.Addr(), "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1")
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy = DialResolved, TargetCounted
	cfg.Counter = counter
	cfg.SyncInterval, cfg.SyncIntervalCap = 20*time.Millisecond, 200*time.Millisecond
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick, "the 2 reachable servers")

	// Over the next rounds the failures back off towards the 200ms cap
	// instead of spinning: count dials over a span of sync rounds.
	start, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
	a.waitSyncRounds(t, a.syncRounds(t)+10)
	end, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
	// A round dials at most once; the reads race a few rounds in flight.
	// A tight loop would show hundreds.
	assert.LessOrEqual(t, end-start, 15.0, "one dial per round at most")
	assert.Equal(t, 2, a.Connected())
}
