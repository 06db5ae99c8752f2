package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
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

	// Each unreachable address backs off on its own towards the 200 ms
	// cap instead of spinning: from 20 ms growing x1.5 (jitter 20%), its
	// next five dials span at least 0.8 x (20+30+45+67.5) ms = 130 ms. A
	// tight loop would make fifteen in a few milliseconds.
	start, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
	begin := time.Now()
	require.Eventually(t, func() bool {
		end, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
		return end-start >= 15
	}, waitFor, time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(begin), 100*time.Millisecond, "the failed dials did not back off")
	assert.Equal(t, 2, a.Connected())
}

// A server address whose connects hang (its SYNs dropped: a black hole)
// holds up no dial to another: each dial runs on its own, and the agent
// holds the servers it can reach long before that dial's HandshakeTimeout.
// The black hole is first in the count's order (127.0.0.10 sorts before
// 127.0.0.1:), where one dial at a time made every other server wait for
// it.
func TestBlackHoledServerHoldsUpNoOther(t *testing.T) {
	tt := newTestTLS(t)
	s0 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s0", Count: "3"})
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "3"})
	hole := nettest.BlackholeAt(t, "127.0.0.10")
	counter, _ := dnsCounter(t, hole, s0.Addr(), s1.Addr())
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy = DialResolved, TargetCounted
	cfg.Counter = counter
	cfg.HandshakeTimeout = time.Minute
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick, "the 2 reachable servers, beside a black-holed one")
	// A good server's dial leaves the list a moment after it is held.
	require.Eventually(t, func() bool { return a.Readiness().Dialing == hole }, waitFor, tick, "the black hole's dial is still under way: dialing %q", a.Readiness().Dialing)
}
