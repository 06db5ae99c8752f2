package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// endpointList is a list of server addresses a test changes, standing in
// for what DNS resolves.
type endpointList struct {
	mu   sync.Mutex
	eps  []string
	err  error
	seen int
}

func (l *endpointList) set(eps ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.eps = eps
}

func (l *endpointList) get(context.Context) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen++
	return append([]string(nil), l.eps...), l.err
}

func TestResolvedModeReachesEachServerInOneDial(t *testing.T) {
	tt := newTestTLS(t)
	var eps endpointList
	var servers []*testServer
	for i := range 5 {
		s := newTestServer(t, tt, serverOpts{id: fmt.Sprintf("s%d", i), count: "5"})
		servers = append(servers, s)
	}
	eps.set(servers[0].addr, servers[1].addr, servers[2].addr)
	cfg := testConfig(tt, "127.0.0.1:1") // the load balancer is never needed
	cfg.DialMode, cfg.Endpoints = DialResolved, eps.get
	cfg.RespectReceivedServerCount = false
	counter := &settableCounter{}
	counter.n.Store(3)
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
	eps.set(servers[0].addr, servers[1].addr, servers[2].addr, servers[3].addr, servers[4].addr)
	counter.n.Store(5)
	require.Eventually(t, func() bool { return a.Connected() == 5 }, waitFor, tick, "5 servers")
	assert.Equal(t, 5.0, dials("ok"))
	assert.Equal(t, 0.0, dials("duplicate")+dials("error"))
}

func TestResolvedModeBacksOffOnUnreachableServers(t *testing.T) {
	tt := newTestTLS(t)
	var eps endpointList
	s0 := newTestServer(t, tt, serverOpts{id: "s0", count: "3"})
	s1 := newTestServer(t, tt, serverOpts{id: "s1", count: "3"})
	// Three more listed that nobody serves: nothing listens on port 1.
	eps.set(s0.addr, s1.addr, "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1")
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.Endpoints = DialResolved, eps.get
	cfg.RespectReceivedServerCount = false
	cfg.SyncInterval, cfg.SyncIntervalCap = 20*time.Millisecond, 200*time.Millisecond
	counter := &settableCounter{}
	counter.n.Store(5)
	cfg.Counter = counter
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
