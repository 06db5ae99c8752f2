package proxytest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

// Timings of the DNS counters built here: short, so that tests and
// benchmarks see a DNS change within tens of milliseconds.
const (
	// DNSCacheExpiry is how long a count stays fresh in the cache.
	DNSCacheExpiry = 50 * time.Millisecond
	// DNSCacheMinExpiry is the wait after a failed refresh.
	DNSCacheMinExpiry = 10 * time.Millisecond
	// DNSMaxCount caps the count, as --server-count-max does.
	DNSMaxCount = agent.DefaultServerCountMax
	// dnsQueryTimeout bounds one DNS query: the server is on loopback, and
	// tests that make it drop queries see the counter retry quickly. A
	// test whose answers take long to build (thousands of records) sets a
	// longer one through DNSCounter's edit.
	dnsQueryTimeout = 200 * time.Millisecond
)

// DNSCounter returns a count of name's records (SRV for an "_port._proto."
// name, else A/AAAA) as cmd/proxy-agent builds it for --server-count-dns: a
// DNSServerCounter asking only the DNS server at dnsAddr, capped at
// DNSMaxCount, behind a CachedServerCounter that refreshes in the
// background every DNSCacheExpiry, with a fallback of 1. Its Close is
// registered with tb.Cleanup. name should be fully qualified (end with a
// dot), so that no search suffix applies. Each edit, in order, may change
// the DNSServerCounter's Config before it is built.
func DNSCounter(tb testing.TB, dnsAddr, name string, edit ...func(*servercounter.Config)) *servercounter.CachedServerCounter {
	tb.Helper()
	cfg := servercounter.Config{
		Name:           name,
		Servers:        []string{dnsAddr},
		Max:            DNSMaxCount,
		Timeout:        dnsQueryTimeout,
		Attempts:       2,
		InitialBackoff: 5 * time.Millisecond,
		MaxBackoff:     20 * time.Millisecond,
	}
	for _, e := range edit {
		e(&cfg)
	}
	src, err := servercounter.NewDNSServerCounter(cfg)
	require.NoError(tb, err, "create DNS server counter for %s at %s", name, dnsAddr)
	cache, err := servercounter.NewCachedServerCounter(src, servercounter.CacheConfig{
		Expiry:    DNSCacheExpiry,
		MinExpiry: DNSCacheMinExpiry,
		Fallback:  1, // otherwise the defaults, as the binaries': see internal/counting
	})
	require.NoError(tb, err, "create cached server counter")
	tb.Cleanup(func() { _ = cache.Close() }) // Close does not fail
	return cache
}

// DNSAgentConfig is [FastAgentConfig] for an agent counting servers through
// DNS: its Counter is [DNSCounter] (dnsAddr, name), it
// aims for that count (agent.TargetCounted), and in mode DialResolved it
// dials the addresses the answer lists. lbAddr is the load balancer
// (ServerAddress), whose port is the default port of A/AAAA answers. The
// sync interval is 20 ms capped at 200 ms, the hold-down 300 ms.
func DNSAgentConfig(tb testing.TB, id, lbAddr, dnsAddr, name string, mode agent.DialMode) agent.Config {
	tb.Helper()
	return DNSAgentConfigFor(id, lbAddr, DNSCounter(tb, dnsAddr, name), mode)
}

// DNSAgentConfigFor is [DNSAgentConfig] with a counter the caller built
// (and closes), for example with [DNSCounter].
func DNSAgentConfigFor(id, lbAddr string, cache *servercounter.CachedServerCounter, mode agent.DialMode) agent.Config {
	cfg := FastAgentConfig(id, lbAddr)
	cfg.SyncIntervalCap = 200 * time.Millisecond
	cfg.HoldDown = 300 * time.Millisecond
	cfg.DialMode = mode
	cfg.Counter, cfg.TargetPolicy = cache, agent.TargetCounted
	return cfg
}
