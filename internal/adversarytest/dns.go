package adversarytest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/miekg/dns"

	"github.com/servercount/servercount/internal/dnstest"
)

// LyingDNS is a DNS server that lies about how many proxy-servers there
// are: it claims absurd numbers of records, or flaps between answers when
// the test says. It is a [dnstest.Server], so the faults of
// [dnstest.Server.SetFault] (wrong IDs, garbage, truncation, silence)
// compose with its lies. It is safe for concurrent use.
type LyingDNS struct {
	*dnstest.Server

	mu    sync.Mutex // guards flaps and next
	flaps [][]dns.RR // the answers Flip cycles through
	next  int        // index in flaps of the answer Flip serves next
}

// StartLyingDNS starts a LyingDNS on loopback until the test ends. It
// answers nothing (NXDOMAIN) until told to lie.
func StartLyingDNS(tb testing.TB) *LyingDNS {
	tb.Helper()
	return &LyingDNS{Server: dnstest.NewServer(tb)}
}

// ClaimRecords returns the SRV records, with their glue, of a headless
// Service name claiming n servers: the first are the real ones (each
// "ip:port"), as many as n allows, the others point at distinct loopback
// addresses where, presumably, nothing listens.
func ClaimRecords(name string, n int, real ...string) []dns.RR {
	addrs := append([]string(nil), real[:min(n, len(real))]...)
	for i := len(addrs); i < n; i++ {
		// 127.1.0.1 and up: loopback, never 127.0.0.1 where the tests'
		// servers listen.
		addrs = append(addrs, fmt.Sprintf("127.%d.%d.%d:6443", 1+i>>16&0xff, i>>8&0xff, i&0xff))
	}
	return dnstest.SRVRecords(name, addrs...)
}

// Claim answers name with n SRV records (see [ClaimRecords]), from the
// next query on: the lie of a server that reports 100000 proxy-servers.
// The answer does not fit a UDP reply: a client gets it truncated, then
// over TCP as far as 64 KiB allows.
func (l *LyingDNS) Claim(name string, n int, real ...string) {
	l.SetRecords(ClaimRecords(name, n, real...)...)
}

// Flap makes name's answer cycle through counts, each a [Claim] with the
// same real servers, and serves the first at once. Each [LyingDNS.Flip]
// moves to the next, so the test decides when the answer changes rather
// than a timer.
func (l *LyingDNS) Flap(name string, counts []int, real ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flaps = l.flaps[:0]
	for _, n := range counts {
		l.flaps = append(l.flaps, ClaimRecords(name, n, real...))
	}
	l.next = 0
	l.flipLocked()
}

// Flip serves the next answer of the cycle Flap set up, and returns its
// index in counts.
func (l *LyingDNS) Flip() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flipLocked()
}

func (l *LyingDNS) flipLocked() int {
	if len(l.flaps) == 0 {
		return -1
	}
	i := l.next
	l.SetRecords(l.flaps[i]...)
	l.next = (i + 1) % len(l.flaps)
	return i
}
