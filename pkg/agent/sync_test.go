package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// changeDuringRead is a Counter that, on its second read (the first is
// NewClientSet's, the second the first sync round's), changes the DNS
// records and waits until the cache has published the new count before it
// returns the old result: the change lands while the agent's round is
// between its read and its next wait.
type changeDuringRead struct {
	*servercounter.CachedServerCounter
	t      *testing.T
	change func()
	reads  atomic.Int32
}

func (c *changeDuringRead) Count(ctx context.Context) (servercounter.Result, error) {
	res, err := c.CachedServerCounter.Count(ctx)
	if c.reads.Add(1) == 2 {
		ch := c.Changed()
		c.change()
		select {
		case <-ch:
		case <-time.After(waitFor):
			c.t.Error("the cache did not publish the change")
		}
	}
	return res, err
}

// A count change that lands during a sync round wakes the next round at
// once: the agent takes the change signal before it reads the count. (It
// used to take it after the round, and such a change then waited for the
// sync interval, here an hour.)
func TestCountChangeDuringRoundIsNotLost(t *testing.T) {
	tt := newTestTLS(t)
	s0 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s0", Count: "1"})
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	cache, dns := dnsCounter(t, s0.Addr())
	require.Eventually(t, func() bool { res, _ := cache.Count(t.Context()); return res.Count == 1 }, waitFor, tick)
	counter := &changeDuringRead{CachedServerCounter: cache, t: t, change: func() {
		dns.SetRecords(dnstest.SRVRecords(srvName, s0.Addr(), s1.Addr())...)
	}}
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy = DialResolved, TargetCounted
	cfg.Counter = counter
	cfg.SyncInterval, cfg.SyncIntervalCap = time.Hour, time.Hour
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick, "the second server, without waiting an hour")
}
