package proxytest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
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
	DNSMaxCount = 100
	// dnsQueryTimeout bounds one DNS query: the server is on loopback.
	dnsQueryTimeout = 200 * time.Millisecond
)

// DNSCounter returns a count of name's records (SRV for an "_port._proto."
// name, else A/AAAA) as cmd/proxy-agent builds it for --server-count-dns: a
// DNSServerCounter asking only the DNS server at dnsAddr, capped at
// DNSMaxCount, behind a CachedServerCounter that refreshes in the
// background every DNSCacheExpiry, with a fallback of 1. Its Close is
// registered with tb.Cleanup. name should be fully qualified (end with a
// dot), so that no search suffix applies.
func DNSCounter(tb testing.TB, dnsAddr, name string) *servercounter.CachedServerCounter {
	tb.Helper()
	src, err := servercounter.NewDNSServerCounter(servercounter.Config{
		Name:           name,
		Servers:        []string{dnsAddr},
		Max:            DNSMaxCount,
		Timeout:        dnsQueryTimeout,
		Attempts:       2,
		InitialBackoff: 5 * time.Millisecond,
		MaxBackoff:     20 * time.Millisecond,
	})
	require.NoError(tb, err, "create DNS server counter for %s at %s", name, dnsAddr)
	cache, err := servercounter.NewCachedServerCounter(src, servercounter.CacheConfig{
		Expiry:     DNSCacheExpiry,
		MinExpiry:  DNSCacheMinExpiry,
		Fallback:   1,
		Background: true,
	})
	require.NoError(tb, err, "create cached server counter")
	tb.Cleanup(func() { _ = cache.Close() }) // Close does not fail
	return cache
}

// DNSAgentConfig is [FastAgentConfig] for an agent counting servers through
// DNS, wired as cmd/proxy-agent wires --server-count-dns: the count comes
// from [DNSCounter] (dnsAddr, name), counts received from servers do not
// overwrite it, and in mode DialResolved the agent dials the addresses the
// answer lists. lbAddr is the load balancer (ServerAddress), whose port is
// the default port of A/AAAA answers. The sync interval is 20 ms capped at
// 200 ms, the hold-down 300 ms.
func DNSAgentConfig(tb testing.TB, id, lbAddr, dnsAddr, name string, mode agent.DialMode) agent.Config {
	tb.Helper()
	return DNSAgentConfigFor(tb, id, lbAddr, DNSCounter(tb, dnsAddr, name), mode)
}

// DNSAgentConfigFor is [DNSAgentConfig] with a counter the caller built
// (and closes), for example with [DNSCounter].
func DNSAgentConfigFor(tb testing.TB, id, lbAddr string, cache *servercounter.CachedServerCounter, mode agent.DialMode) agent.Config {
	tb.Helper()
	_, portText, err := net.SplitHostPort(lbAddr)
	require.NoError(tb, err, "load balancer address %q", lbAddr)
	port, err := strconv.Atoi(portText)
	require.NoError(tb, err, "load balancer port %q", portText)

	cfg := FastAgentConfig(id, lbAddr)
	cfg.SyncIntervalCap = 200 * time.Millisecond
	cfg.HoldDown = 300 * time.Millisecond
	cfg.DialMode = mode
	cfg.Counter, cfg.RespectReceivedServerCount = cache, false
	cfg.Endpoints = func(ctx context.Context) ([]string, error) {
		res, err := cache.Count(ctx)
		if err != nil || res.Source != servercounter.SourceDNS {
			return nil, err
		}
		return res.Endpoints(port), nil
	}
	return cfg
}

// SRVRecords returns the records of a headless Service whose servers
// listen at addrs (each "ip:port", ports may differ): per server an SRV
// record at name (e.g. "_agent._tcp.proxy.test.svc.cluster.local.") with
// target "s<i>.<name without its first two labels>" and that target's A or
// AAAA record, which the DNS server sends along as glue. TTLs are 1 s.
// SRVRecords panics on an address that is not ip:port: addresses are
// fixtures.
func SRVRecords(name string, addrs ...string) []dns.RR {
	name = dns.Fqdn(name)
	labels := dns.SplitDomainName(name)
	parent := name
	if len(labels) > 2 {
		parent = dns.Fqdn(strings.Join(labels[2:], "."))
	}
	rrs := make([]dns.RR, 0, 2*len(addrs))
	for i, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			panic(fmt.Sprintf("proxytest: SRVRecords(%q): %v", name, err))
		}
		target := fmt.Sprintf("s%d.%s", i, parent)
		rrs = append(rrs, &dns.SRV{
			Hdr:    dns.RR_Header{Name: name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 1},
			Weight: 100, Port: ap.Port(), Target: target,
		})
		ip := ap.Addr().Unmap()
		if ip.Is4() {
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: target, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: ip.AsSlice()})
		} else {
			rrs = append(rrs, &dns.AAAA{Hdr: dns.RR_Header{Name: target, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 1}, AAAA: ip.AsSlice()})
		}
	}
	return rrs
}
