package servercounter_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

const shortSvc = "p.example."

// A fresh cached read, next to the same int read through a mutex, and a
// plain atomic load: the floor. Each read is a direct call, as callers
// make it, so that the compiler may inline it.
func BenchmarkCachedCountServers(b *testing.B) {
	c, err := servercounter.NewCachedServerCounter(servercounter.StaticServerCounter(3), servercounter.CacheConfig{Expiry: time.Hour, RefreshOnRead: true, ExactExpiry: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.CountServers()
	var (
		mu      sync.Mutex
		guarded = 3
		atom    atomic.Int64
	)
	atom.Store(3)
	mutexRead := func() int {
		mu.Lock()
		defer mu.Unlock()
		return guarded
	}

	b.Run("cached/serial", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			n += c.CountServers()
		}
		sink.Store(int64(n))
	})
	b.Run("cached/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			n := 0
			for pb.Next() {
				n += c.CountServers()
			}
			sink.Store(int64(n))
		})
	})
	b.Run("cached/interface", func(b *testing.B) {
		// Through the interface, as most callers hold it: no inlining.
		var sc servercounter.ServerCounter = c
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			n += sc.CountServers()
		}
		sink.Store(int64(n))
	})
	b.Run("baseline=mutex/serial", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			n += mutexRead()
		}
		sink.Store(int64(n))
	})
	b.Run("baseline=mutex/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			n := 0
			for pb.Next() {
				n += mutexRead()
			}
			sink.Store(int64(n))
		})
	})
	b.Run("baseline=atomic/serial", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			n += int(atom.Load())
		}
		sink.Store(int64(n))
	})
}

// sink keeps benchmark results alive.
var sink atomic.Int64

// benchServer serves a headless Service of n replicas at svc and at
// shortSvc, whose SRV answer for 1000 replicas fits in 64 KiB (SRV targets
// are never compressed).
func benchServer(b *testing.B, n int) *dnstest.Server {
	b.Helper()
	srv := dnstest.NewServer(b)
	ips := make([]string, n)
	for i := range ips {
		ips[i] = net.IPv4(10, 1, byte(i/250), byte(i%250+1)).String()
	}
	srv.SetRecords(append(dnstest.Headless(svc, "agent", "tcp", 8091, ips...),
		dnstest.Headless(shortSvc, "agent", "tcp", 8091, ips...)...)...)
	return srv
}

// goResolver is Go's own resolver, sent to srv whatever nameserver it picks.
func goResolver(srv *dnstest.Server) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, srv.Addr())
		},
	}
}

func benchCounter(b *testing.B, srv *dnstest.Server, name string, typ servercounter.RecordType) *servercounter.DNSServerCounter {
	b.Helper()
	c, err := servercounter.NewDNSServerCounter(servercounter.Config{Name: name, Type: typ, Servers: []string{srv.Addr()}})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// compare runs ours and theirs alternately in one loop, each first every
// other time, so that both see the same machine, and reports each one's
// time and the ratio ours/theirs.
func compare(b *testing.B, want int, ours func() (int, error), theirs func() (int, error)) {
	b.ReportAllocs()
	var tOurs, tTheirs time.Duration
	timed := func(f func() (int, error), total *time.Duration) {
		start := time.Now()
		n, err := f()
		*total += time.Since(start)
		if err != nil || n != want {
			b.Fatalf("count %d (%v), want %d", n, err, want)
		}
	}
	odd := false
	for b.Loop() {
		if odd {
			timed(ours, &tOurs)
			timed(theirs, &tTheirs)
		} else {
			timed(theirs, &tTheirs)
			timed(ours, &tOurs)
		}
		odd = !odd
	}
	b.ReportMetric(float64(tOurs.Nanoseconds())/float64(b.N), "ours-ns/op")
	b.ReportMetric(float64(tTheirs.Nanoseconds())/float64(b.N), "net-ns/op")
	b.ReportMetric(float64(tOurs)/float64(tTheirs), "ratio")
}

// An SRV count of a 3-target name next to net.Resolver.LookupSRV of the
// same name on the same server.
func BenchmarkSRVCountVsLookupSRV(b *testing.B) {
	srv := benchServer(b, 3)
	name := "_agent._tcp." + svc
	c := benchCounter(b, srv, name, servercounter.TypeSRV)
	r := goResolver(srv)
	ctx := b.Context()
	compare(b, 3,
		func() (int, error) { res, err := c.Count(ctx); return res.Count, err },
		func() (int, error) { _, srvs, err := r.LookupSRV(ctx, "", "", name); return len(srvs), err })
}

// An "ip" count (A and AAAA) next to net.Resolver.LookupHost of the same
// name on the same server.
func BenchmarkIPCountVsLookupHost(b *testing.B) {
	srv := benchServer(b, 3)
	c := benchCounter(b, srv, svc, servercounter.TypeIP)
	r := goResolver(srv)
	ctx := b.Context()
	compare(b, 3,
		func() (int, error) { res, err := c.Count(ctx); return res.Count, err },
		func() (int, error) { addrs, err := r.LookupHost(ctx, svc); return len(addrs), err })
}

// Counts alone, for their allocations.
func BenchmarkDNSCount(b *testing.B) {
	for _, tc := range []struct {
		n    int
		name string
		typ  servercounter.RecordType
	}{
		{3, "_agent._tcp." + svc, servercounter.TypeSRV},
		{3, svc, servercounter.TypeIP},
		{1000, "_agent._tcp." + shortSvc, servercounter.TypeSRV}, // needs TCP fallback
	} {
		b.Run(fmt.Sprintf("%s/%d", tc.typ, tc.n), func(b *testing.B) {
			srv := benchServer(b, tc.n)
			c := benchCounter(b, srv, tc.name, tc.typ)
			b.ReportAllocs()
			for b.Loop() {
				res, err := c.Count(b.Context())
				if err != nil || res.Count != tc.n {
					b.Fatalf("count %d, %v", res.Count, err)
				}
			}
		})
	}
}
