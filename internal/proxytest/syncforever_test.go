package proxytest

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

// settableCount is a ServerCounter a test changes.
type settableCount struct{ n atomic.Int64 }

func (c *settableCount) CountServers() int { return int(c.n.Load()) }

// With SyncForever the agent keeps opening streams "to learn counts", but
// the serverCount of a stream to an already-connected server is dropped
// (ClientSet.add returns dialDuplicate before policy.observeReceived), so
// it never learns a count that changed on the servers it holds.
func TestSyncForeverLearnsCountFromDuplicates(t *testing.T) {
	f := newFleet(t)
	c := &settableCount{}
	c.n.Store(1)
	s := f.start(1, func() servercounter.ServerCounter { return c })[0]
	f.lb.SetBackends(s.AgentAddr())
	a := f.upstreamAgent(func(cfg *agent.Config) { cfg.SyncForever = true })
	waitHolding(t, a, 1)
	c.n.Store(2) // the server now reports 2; only it is behind the balancer
	st := agentState{a}
	dups := st.dials(t, "duplicate")
	require.Eventually(t, func() bool { return st.dials(t, "duplicate") >= dups+5 }, waitFor, tick)
	require.Equal(t, 2, a.ClientSet().Target(), "the agent read serverCount 2 on 5 streams but did not take it")
}
