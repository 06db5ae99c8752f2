package servercounter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

func TestMaxCounter(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	cache, _ := newCache(t, newCounter(t, srv, svc), servercounter.CacheConfig{Expiry: time.Minute})
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
	cache, clk := newCache(t, newCounter(t, srv, svc), servercounter.CacheConfig{Expiry: time.Minute, Background: true})
	m := servercounter.NewMaxCounter(servercounter.StaticServerCounter(1), cache)
	defer m.Close()
	eventually(t, func() bool { res, _ := cache.Count(t.Context()); return res.Source == servercounter.SourceDNS }, "first DNS count")

	ch := m.Changed()
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	expire(t, clk, time.Minute)
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal("a change of the DNS count did not reach the MaxCounter's watchers")
	}
	res, err := m.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, res.Count)
}
