package servercounter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

func TestMaxCounter(t *testing.T) {
	t.Parallel()
	// headless3 has two A records there.
	dc := newCounterAt(t, headless3Shared.addr(t), "dual.kube-system.svc.cluster.local.", func(c *servercounter.Config) { c.Type = servercounter.TypeA })
	cache, _ := newCache(t, dc, servercounter.CacheConfig{Expiry: time.Minute, RefreshOnRead: true, ExactExpiry: true})
	failing := counterFunc(func(context.Context) (servercounter.Result, error) {
		return servercounter.Result{}, errors.New("API server down")
	})

	m := servercounter.NewMaxCounter(servercounter.StaticServerCounter(3), cache, failing)
	defer m.Close()
	res, err := m.Count(t.Context())
	require.NoError(t, err, "a failing source is left out")
	assert.Equal(t, 3, res.Count)
	assert.Equal(t, servercounter.SourceStatic, res.Source)

	m2 := servercounter.NewMaxCounter(servercounter.StaticServerCounter(1), cache)
	defer m2.Close()
	res, err = m2.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, res.Count)
	assert.Equal(t, servercounter.SourceDNS, res.Source, "the source of the largest count")

	_, err = servercounter.NewMaxCounter(failing, failing).Count(t.Context())
	assert.ErrorContains(t, err, "API server down", "every source failed")
}

func TestMaxCounterRelaysChanges(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1")...)
	cache, clk := newCache(t, newCounter(t, srv, svc), servercounter.CacheConfig{Expiry: time.Minute, ExactExpiry: true})
	m := servercounter.NewMaxCounter(servercounter.StaticServerCounter(1), cache)
	defer m.Close()
	eventually(t, func() bool { res, _ := cache.Count(t.Context()); return res.Source == servercounter.SourceDNS }, "first DNS count")

	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	expire(t, clk, time.Minute)
	// As Notifier asks: take the channel, then read; wait only while the
	// count is not yet the new one. A signal of the first DNS count may
	// still be on its way, so one wake-up may come early.
	for {
		ch := m.Changed()
		res, err := m.Count(t.Context())
		require.NoError(t, err)
		if res.Count == 2 {
			return
		}
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatal("a change of the DNS count did not reach the MaxCounter's watchers")
		}
	}
}

// notifyingCounter is a Counter and Notifier whose count the test sets.
type notifyingCounter struct {
	mu      sync.Mutex
	count   int
	changed chan struct{}
}

func (c *notifyingCounter) Count(context.Context) (servercounter.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return servercounter.Result{Count: c.count, Found: c.count, Source: servercounter.SourceDNS}, nil
}

func (c *notifyingCounter) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *notifyingCounter) set(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count = n
	close(c.changed)
	c.changed = make(chan struct{})
}

// Every change is relayed, however soon after the one before it comes: a
// watcher that subscribes again only after relaying loses a change made in
// between (it did, under load).
func TestMaxCounterRelaysEveryChange(t *testing.T) {
	t.Parallel()
	src := &notifyingCounter{count: 1, changed: make(chan struct{})}
	m := servercounter.NewMaxCounter(servercounter.StaticServerCounter(1), src)
	defer m.Close()
	for n := 2; n < 100; n++ {
		ch := m.Changed()
		src.set(n)
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatalf("the change to %d was not relayed", n)
		}
		res, err := m.Count(t.Context())
		require.NoError(t, err)
		require.Equal(t, n, res.Count)
	}
}
