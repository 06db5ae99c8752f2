package servercounter_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/logtest"
	"github.com/servercount/servercount/pkg/servercounter"
)

const svc = "proxy.kube-system.svc.cluster.local."

// headless3 is a 3-replica headless Service with two named ports, so that
// an SRV query without _port._proto-style filtering sees two records per
// replica, and names of every other shape the tests count. The records at
// s.example. and its SRV targets are out of order, for the tests of order.
var headless3 = `
proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.1
proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.2
proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.3
p1.proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.1
p2.proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.2
p3.proxy.kube-system.svc.cluster.local. 30 IN A 10.0.0.3
_agent._tcp.proxy.kube-system.svc.cluster.local. 20 IN SRV 0 33 8091 p1.proxy.kube-system.svc.cluster.local.
_agent._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8091 p2.proxy.kube-system.svc.cluster.local.
_agent._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8091 P3.proxy.kube-system.svc.cluster.local.
_all._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8091 p1.proxy.kube-system.svc.cluster.local.
_all._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8092 p1.proxy.kube-system.svc.cluster.local.
_all._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8091 p2.proxy.kube-system.svc.cluster.local.
_all._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 33 8092 p2.proxy.kube-system.svc.cluster.local.
dual.kube-system.svc.cluster.local. 30 IN A 10.0.0.1
dual.kube-system.svc.cluster.local. 30 IN A 10.0.0.2
dual.kube-system.svc.cluster.local. 30 IN AAAA fd00::1
dual.kube-system.svc.cluster.local. 30 IN AAAA fd00::2
dual.kube-system.svc.cluster.local. 30 IN AAAA fd00::3
v6.kube-system.svc.cluster.local. 30 IN AAAA fd00::1
dup.kube-system.svc.cluster.local. 30 IN A 10.0.0.1
dup.kube-system.svc.cluster.local. 30 IN A 10.0.0.1
alias.example. 10 IN CNAME alias2.example.
alias2.example. 10 IN CNAME proxy.kube-system.svc.cluster.local.
loop1.example. 10 IN CNAME loop2.example.
loop2.example. 10 IN CNAME loop1.example.
nosrv._tcp.proxy.kube-system.svc.cluster.local. 30 IN SRV 0 0 8091 .
txtonly.example. 30 IN TXT "x"
s.example. 30 IN A 10.0.0.9
s.example. 30 IN A 10.0.0.10
s.example. 30 IN A 10.0.0.1
_agent._tcp.s.example. 30 IN SRV 0 33 8091 s2.example.
_agent._tcp.s.example. 30 IN SRV 0 33 8092 s1.example.
_agent._tcp.s.example. 30 IN SRV 0 33 8091 s6.example.
s2.example. 30 IN A 10.0.0.2
s1.example. 30 IN A 10.0.0.1
s6.example. 30 IN AAAA fd00::1
`

// newCounter starts a counter of name against srv with fast retries.
func newCounter(t *testing.T, srv *dnstest.Server, name string, mod ...func(*servercounter.Config)) *servercounter.DNSServerCounter {
	t.Helper()
	return newCounterAt(t, srv.Addr(), name, mod...)
}

// newCounterAt is newCounter against the server at addr.
func newCounterAt(t *testing.T, addr, name string, mod ...func(*servercounter.Config)) *servercounter.DNSServerCounter {
	t.Helper()
	cfg := servercounter.Config{
		Name:       name,
		Servers:    []string{addr},
		ResolvConf: emptyResolvConf(t),
		// Every query these counters send is answered, so the timeout
		// only bounds a loaded machine's delays: 500 ms ran out under a
		// load of 16 on two cores.
		Timeout: waitFor,
		// Back-offs short enough that a retried count costs the test
		// nothing measurable, long enough to be real waits.
		InitialBackoff: 50 * time.Microsecond,
		MaxBackoff:     200 * time.Microsecond,
	}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := servercounter.NewDNSServerCounter(cfg)
	require.NoError(t, err)
	return c
}

// faultTimeout is the per-query timeout of tests on a manual clock: any
// value works, since the clock moves only when countOnClock moves it.
const faultTimeout = 100 * time.Millisecond

// countOutcome is what one Count returned.
type countOutcome struct {
	res servercounter.Result
	err error
}

// countInBackground runs c.Count in a goroutine of its own and sends what
// it returns on the channel.
func countInBackground(t *testing.T, c *servercounter.DNSServerCounter) <-chan countOutcome {
	done := make(chan countOutcome, 1)
	go func() {
		res, err := c.Count(t.Context())
		done <- countOutcome{res, err}
	}()
	return done
}

// countOnClock runs c.Count on the manual clock clk, which c must use
// with Timeout faultTimeout. Back-off waits pass at once; the first
// timeouts query timeouts pass once srv has taken that query, so every
// attempt reaches the server and no answer races a timeout. Later
// queries must be answered.
func countOnClock(t *testing.T, c *servercounter.DNSServerCounter, clk *clocktest.Clock, srv *dnstest.Server, timeouts int) (servercounter.Result, error) {
	t.Helper()
	done := countInBackground(t, c)
	// A fine poll: each step of the clock waits for one tick, and a
	// count takes several.
	tick := time.NewTicker(50 * time.Microsecond)
	defer tick.Stop()
	deadline := time.After(waitFor)
	fired := 0
	for {
		select {
		case o := <-done:
			return o.res, o.err
		case <-deadline:
			t.Fatalf("Count did not return within %v on the manual clock (%d timeouts fired)", waitFor, fired)
		case <-tick.C:
		}
		d, ok := clk.Next()
		switch {
		case !ok:
		case d != faultTimeout:
			clk.Step(d) // a back-off wait
		case fired < timeouts && srv.Queries("") > fired:
			fired++
			clk.Step(d)
		}
	}
}

// emptyResolvConf is a resolv.conf with nothing in it, so that the
// counter uses only the servers a test gives it. One empty file serves
// every test: a temporary directory per counter was a fifth of this
// package's test time.
func emptyResolvConf(testing.TB) string { return os.DevNull }

// searchResolvConf searches three domains with ndots:5, as a pod's
// resolv.conf does, and names a nameserver no test asks. Like every
// resolv.conf these tests read, it is a file in testdata rather than one
// written to a temporary directory per test, for the same reason as
// emptyResolvConf.
const searchResolvConf = "testdata/search.resolv.conf"

func TestDNSCount(t *testing.T) {
	t.Parallel()
	addr := headless3Shared.addr(t)

	tests := []struct {
		name        string
		qname       string
		typ         servercounter.RecordType
		wantCount   int
		wantOutcome servercounter.Outcome
		wantType    servercounter.RecordType
		wantTTL     time.Duration
		wantAnswer  int
		wantExtra   int
	}{
		{name: "srv targets", qname: "_agent._tcp." + svc, wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeSRV, wantTTL: 20 * time.Second, wantAnswer: 3, wantExtra: 3},
		{name: "srv counts targets not ports", qname: "_all._tcp." + svc, wantCount: 2, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeSRV, wantTTL: 30 * time.Second, wantAnswer: 4, wantExtra: 2},
		{name: "srv target dot means no service", qname: "nosrv._tcp." + svc, typ: servercounter.TypeSRV, wantCount: 0, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeSRV, wantTTL: 30 * time.Second, wantAnswer: 1},
		{name: "ip counts addresses", qname: svc, wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 30 * time.Second, wantAnswer: 3},
		{name: "ip dual-stack takes larger family", qname: "dual.kube-system.svc.cluster.local.", wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 30 * time.Second, wantAnswer: 5},
		{name: "ip v6 only", qname: "v6.kube-system.svc.cluster.local.", wantCount: 1, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 30 * time.Second, wantAnswer: 1},
		{name: "a only", qname: "dual.kube-system.svc.cluster.local.", typ: servercounter.TypeA, wantCount: 2, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeA, wantTTL: 30 * time.Second, wantAnswer: 2},
		{name: "aaaa only", qname: "dual.kube-system.svc.cluster.local.", typ: servercounter.TypeAAAA, wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeAAAA, wantTTL: 30 * time.Second, wantAnswer: 3},
		{name: "duplicate addresses count once", qname: "dup.kube-system.svc.cluster.local.", wantCount: 1, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 30 * time.Second, wantAnswer: 2},
		{name: "cname chain", qname: "alias.example.", wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 10 * time.Second, wantAnswer: 3},
		{name: "case-insensitive name", qname: "PROXY.Kube-System.svc.cluster.local.", wantCount: 3, wantOutcome: servercounter.OutcomeRecords, wantType: servercounter.TypeIP, wantTTL: 30 * time.Second, wantAnswer: 3},
		{name: "nxdomain is a valid zero", qname: "gone.kube-system.svc.cluster.local.", wantCount: 0, wantOutcome: servercounter.OutcomeNXDomain, wantType: servercounter.TypeIP, wantTTL: 5 * time.Second},
		{name: "wrong port name is nxdomain", qname: "_nope._tcp." + svc, wantCount: 0, wantOutcome: servercounter.OutcomeNXDomain, wantType: servercounter.TypeSRV, wantTTL: 5 * time.Second},
		{name: "nodata is a valid zero", qname: "txtonly.example.", wantCount: 0, wantOutcome: servercounter.OutcomeNoData, wantType: servercounter.TypeIP, wantTTL: 5 * time.Second},
		{name: "srv at an address name is nodata", qname: svc, typ: servercounter.TypeSRV, wantCount: 0, wantOutcome: servercounter.OutcomeNoData, wantType: servercounter.TypeSRV, wantTTL: 5 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCounterAt(t, addr, tc.qname, func(cfg *servercounter.Config) { cfg.Type = tc.typ })
			res, err := c.Count(t.Context())
			require.NoError(t, err)
			assert.Equal(t, tc.wantCount, res.Count, "count")
			assert.Equal(t, tc.wantOutcome, res.Outcome, "outcome")
			assert.Equal(t, tc.wantType, res.Type, "type")
			assert.Equal(t, servercounter.SourceDNS, res.Source, "source")
			assert.Equal(t, tc.wantTTL, res.TTL, "ttl")
			assert.Len(t, res.Answer, tc.wantAnswer, "answer")
			assert.Len(t, res.Extra, tc.wantExtra, "extra")
			assert.Equal(t, addr, res.Server)
			assert.Equal(t, servercounter.TransportUDP, res.Transport)
			assert.False(t, res.Truncated)
			assert.Equal(t, strings.ToLower(tc.qname), res.Name)
		})
	}
}

func TestDNSCountAnswerIsSorted(t *testing.T) {
	t.Parallel()
	// headless3 serves them as 10.0.0.9, 10.0.0.10, 10.0.0.1.
	res, err := newCounterAt(t, headless3Shared.addr(t), "s.example.", func(c *servercounter.Config) { c.Type = servercounter.TypeA }).Count(t.Context())
	require.NoError(t, err)
	var got []string
	for _, rr := range res.Answer {
		got = append(got, rr.(*dns.A).A.String())
	}
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.9", "10.0.0.10"}, got)
}

func TestDNSCountFollowsRecordChanges(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	c := newCounter(t, srv, svc)
	// Up, down to zero and up from it, and down.
	for _, n := range []int{2, 0, 3, 1} {
		var ips []string
		for i := range n {
			ips = append(ips, net.IPv4(10, 0, 1, byte(i+1)).String())
		}
		srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, ips...)...)
		res, err := c.Count(t.Context())
		require.NoError(t, err)
		assert.Equal(t, n, res.Count)
	}
}

func TestDNSCountSearchList(t *testing.T) {
	t.Parallel()
	addr := headless3Shared.addr(t)

	tests := []struct {
		name      string
		qname     string
		wantCount int
		wantName  string
		wantNames []string
	}{
		{name: "short name uses search", qname: "proxy", wantCount: 3, wantName: svc,
			wantNames: []string{svc, "proxy.svc.cluster.local.", "proxy.cluster.local.", "proxy."}},
		{name: "namespaced name uses search", qname: "proxy.kube-system", wantCount: 3, wantName: svc},
		{name: "srv name uses search", qname: "_agent._tcp.proxy", wantCount: 3, wantName: "_agent._tcp." + svc},
		{name: "trailing dot means no search", qname: "proxy.", wantCount: 0, wantName: "proxy.", wantNames: []string{"proxy."}},
		{name: "absent everywhere is zero for the name as given", qname: "nothere", wantCount: 0, wantName: "nothere."},
		// A name that already ends in a search domain is asked
		// as it is first, where ndots:5 would have a resolver ask three
		// names that cannot exist before it.
		{name: "a name in a search domain is asked first", qname: "proxy.kube-system.svc.cluster.local", wantCount: 3, wantName: svc,
			wantNames: []string{svc, "proxy.kube-system.svc.cluster.local.kube-system.svc.cluster.local.", "proxy.kube-system.svc.cluster.local.svc.cluster.local.", "proxy.kube-system.svc.cluster.local.cluster.local."}},
		{name: "an srv name in a search domain is asked first", qname: "_agent._tcp.proxy.kube-system.svc.cluster.local", wantCount: 3, wantName: "_agent._tcp." + svc},
		{name: "a name in no search domain is searched", qname: "proxy.kube-system.svc", wantCount: 3, wantName: svc,
			wantNames: []string{"proxy.kube-system.svc.kube-system.svc.cluster.local.", "proxy.kube-system.svc.svc.cluster.local.", svc, "proxy.kube-system.svc."}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCounterAt(t, addr, tc.qname, func(c *servercounter.Config) { c.ResolvConf = searchResolvConf })
			if tc.wantNames != nil {
				assert.Equal(t, tc.wantNames, c.Names())
			}
			res, err := c.Count(t.Context())
			require.NoError(t, err)
			assert.Equal(t, tc.wantCount, res.Count)
			assert.Equal(t, tc.wantName, res.Name)
		})
	}
}

// The documented name costs what its record type costs in a
// pod's resolv.conf (ndots:5, three search domains): A and AAAA, one
// query each, or one SRV query; counted at the DNS server.
func TestDNSCountQueriesPerRefreshInAPod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		qname string
		want  int
	}{
		{qname: "proxy.kube-system.svc.cluster.local", want: 2},
		{qname: "_agent._tcp.proxy.kube-system.svc.cluster.local", want: 1},
	} {
		t.Run(tc.qname, func(t *testing.T) {
			t.Parallel()
			srv := newHeadless3Server(t)
			c := newCounter(t, srv, tc.qname, func(c *servercounter.Config) { c.ResolvConf = searchResolvConf })
			res, err := c.Count(t.Context())
			require.NoError(t, err)
			require.Equal(t, 3, res.Count)
			assert.Equal(t, tc.want, srv.Queries("udp")+srv.Queries("tcp"), "queries for one count")
		})
	}
}

// A count that follows a failed one tries once, not Attempts
// times: the caller's calls are the retries, and a fleet must not
// multiply them against a failing DNS. A success restores the attempts.
func TestDNSCountTriesOnceAfterAFailure(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	c := newCounter(t, srv, "_agent._tcp."+svc, func(c *servercounter.Config) {
		c.Attempts, c.InitialBackoff, c.MaxBackoff = 3, time.Millisecond, time.Millisecond
	})
	queries := func() int { return srv.Queries("udp") + srv.Queries("tcp") }
	for i, want := range []int{3, 4, 5} {
		_, err := c.Count(t.Context())
		require.Error(t, err)
		assert.Equal(t, want, queries(), "queries after count %d", i+1)
	}
	srv.ClearFault()
	_, err := c.Count(t.Context())
	require.NoError(t, err)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	before := queries()
	_, err = c.Count(t.Context())
	require.Error(t, err)
	assert.Equal(t, 3, queries()-before, "a success restores the attempts")
}

func TestDNSCountFailureOnSearchNameIsNotZero(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	// One try: a retry would fail the same way.
	c := newCounter(t, srv, "proxy", func(c *servercounter.Config) { c.ResolvConf, c.Attempts = searchResolvConf, 1 })
	_, err := c.Count(t.Context())
	var de *servercounter.DNSError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, servercounter.ErrorServerFailure, de.Kind)
}

func TestDNSCountFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		fault     dnstest.Fault
		wantKind  servercounter.ErrorKind
		wantRcode int
	}{
		{name: "servfail", fault: dnstest.Fault{Kind: dnstest.FaultServFail}, wantKind: servercounter.ErrorServerFailure, wantRcode: dns.RcodeServerFailure},
		{name: "refused", fault: dnstest.Fault{Kind: dnstest.FaultRefused}, wantKind: servercounter.ErrorRefused, wantRcode: dns.RcodeRefused},
		{name: "no answer", fault: dnstest.Fault{Kind: dnstest.FaultDrop}, wantKind: servercounter.ErrorTimeout, wantRcode: -1},
		{name: "slower than the timeout", fault: dnstest.Fault{Kind: dnstest.FaultSlow, Delay: 2 * time.Second}, wantKind: servercounter.ErrorTimeout, wantRcode: -1},
		{name: "wrong id over udp is ignored until the timeout", fault: dnstest.Fault{Kind: dnstest.FaultWrongID, Network: "udp"}, wantKind: servercounter.ErrorTimeout, wantRcode: -1},
		{name: "wrong question over udp is ignored until the timeout", fault: dnstest.Fault{Kind: dnstest.FaultWrongQuestion}, wantKind: servercounter.ErrorTimeout, wantRcode: -1},
		{name: "garbage", fault: dnstest.Fault{Kind: dnstest.FaultGarbage}, wantKind: servercounter.ErrorMalformed, wantRcode: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newHeadless3Server(t)
			srv.SetFault(tc.fault)
			clk := clocktest.New(time.Now())
			c := newCounter(t, srv, "_agent._tcp."+svc, func(c *servercounter.Config) {
				c.Timeout, c.Clock = faultTimeout, clk
				c.Attempts = 2
			})
			timeouts := 0
			if tc.wantKind == servercounter.ErrorTimeout {
				timeouts = 2
			}
			res, err := countOnClock(t, c, clk, srv, timeouts)
			require.Error(t, err)
			assert.Zero(t, res.Count)
			var de *servercounter.DNSError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tc.wantKind, de.Kind, "kind: %v", err)
			assert.Equal(t, tc.wantRcode, de.Rcode)
			assert.Equal(t, 2, de.Attempts)
			assert.Equal(t, srv.Addr(), de.Server)
			assert.Equal(t, "_agent._tcp."+svc, de.Name)
			assert.Contains(t, err.Error(), "count servers at _agent._tcp."+svc+": ")
			assert.Equal(t, 2, srv.Queries(""), "one query per attempt")
		})
	}
}

// Over TCP no stray reply can reach the socket, so a reply to another
// query is a broken server, not a spoofing attempt to wait out.
func TestDNSCountMismatchOverTCPIsMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fault   dnstest.FaultKind
		wantErr func(t *testing.T, err error)
	}{
		{dnstest.FaultWrongID, func(t *testing.T, err error) { assert.ErrorIs(t, err, dns.ErrId) }},
		{dnstest.FaultWrongQuestion, func(t *testing.T, err error) { assert.ErrorContains(t, err, "another question") }},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			t.Parallel()
			srv := newHeadless3Server(t)
			srv.SetFault(dnstest.Fault{Kind: tc.fault})
			// One query, of one type: the check of the reply is under
			// test, and each query over TCP costs a connection.
			c := newCounter(t, srv, svc, func(c *servercounter.Config) { c.TCP, c.Attempts, c.Type = true, 1, servercounter.TypeA })
			_, err := c.Count(t.Context())
			var de *servercounter.DNSError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, servercounter.ErrorMalformed, de.Kind)
			tc.wantErr(t, err)
		})
	}
}

func TestDNSCountCNAMELoopIsAnError(t *testing.T) {
	t.Parallel()
	// One try: the answer's classification is under test, not the
	// retries.
	_, err := newCounterAt(t, headless3Shared.addr(t), "loop1.example.", func(c *servercounter.Config) { c.Attempts = 1 }).Count(t.Context())
	var de *servercounter.DNSError
	require.ErrorAs(t, err, &de, "a CNAME loop is broken DNS, not zero servers")
	assert.Equal(t, servercounter.ErrorMalformed, de.Kind)
	assert.ErrorContains(t, err, "CNAME chain longer than 8 names")
}

func TestDNSCountRetriesAfterTransientFailure(t *testing.T) {
	t.Parallel()
	for _, kind := range []dnstest.FaultKind{dnstest.FaultServFail, dnstest.FaultRefused, dnstest.FaultDrop, dnstest.FaultGarbage} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			srv := newHeadless3Server(t)
			srv.SetFault(dnstest.Fault{Kind: kind, Count: 2})
			clk := clocktest.New(time.Now())
			c := newCounter(t, srv, "_agent._tcp."+svc, func(c *servercounter.Config) { c.Timeout, c.Clock = faultTimeout, clk })
			timeouts := 0
			if kind == dnstest.FaultDrop {
				timeouts = 2
			}
			res, err := countOnClock(t, c, clk, srv, timeouts)
			require.NoError(t, err)
			assert.Equal(t, 3, res.Count)
			assert.Equal(t, 3, srv.Queries(""))
		})
	}
}

// A try that times out keeps listening while the next one runs: its late
// answer counts, where closing its socket would have lost it.
func TestDNSCountLateAnswerToEarlierTryCounts(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultHold})
	clk := clocktest.New(time.Now())
	c := newCounter(t, srv, "_agent._tcp."+svc, func(c *servercounter.Config) {
		c.Timeout, c.Clock, c.Attempts = faultTimeout, clk, 2
	})
	done := countInBackground(t, c)
	eventually(t, func() bool { return srv.Held() == 1 }, "the first try's query held")
	expire(t, clk, faultTimeout)
	eventually(t, func() bool { return srv.Held() == 2 }, "the second try's query held")
	require.True(t, srv.Release(), "answer the first query, late")
	select {
	case o := <-done:
		require.NoError(t, o.err)
		assert.Equal(t, 3, o.res.Count)
	case <-time.After(waitFor):
		t.Fatal("the late answer to the first try was not counted")
	}
}

func TestDNSCountTriesNextNameserver(t *testing.T) {
	t.Parallel()
	addr := headless3Shared.addr(t)
	down := closedUDPAddr(t)
	c := newCounterAt(t, addr, svc, func(c *servercounter.Config) {
		c.Servers = []string{down, addr}
		c.Timeout = 200 * time.Millisecond
	})
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, res.Count)
	assert.Equal(t, addr, res.Server)
}

func TestDNSCountServerDown(t *testing.T) {
	t.Parallel()
	down := closedUDPAddr(t)
	c, err := servercounter.NewDNSServerCounter(servercounter.Config{
		Name: svc, Servers: []string{down}, ResolvConf: emptyResolvConf(t),
		Timeout:        200 * time.Millisecond,
		InitialBackoff: 50 * time.Microsecond, MaxBackoff: 200 * time.Microsecond, // as newCounter's
	})
	require.NoError(t, err)
	_, err = c.Count(t.Context())
	var de *servercounter.DNSError
	require.ErrorAs(t, err, &de)
	// Loopback answers a closed UDP port with ICMP port unreachable.
	assert.Contains(t, []servercounter.ErrorKind{servercounter.ErrorNetwork, servercounter.ErrorTimeout}, de.Kind)
	assert.Equal(t, servercounter.DefaultAttempts, de.Attempts)
}

func TestDNSCountHonoursContextDeadline(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultDrop})
	// The per-query timeout is on a clock that never moves: only the
	// context's deadline can end the count.
	c := newCounter(t, srv, svc, func(c *servercounter.Config) {
		c.Clock = clocktest.New(time.Now())
		c.Attempts = 100
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Millisecond)
	defer cancel()
	_, err := c.Count(ctx)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var de *servercounter.DNSError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, servercounter.ErrorTimeout, de.Kind)
}

func TestDNSCountTruncatedUDPFallsBackToTCP(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	// The 1232-byte EDNS0 UDP payload carries 74 A records of a
	// compressed name, and 30 SRV records whose targets are the 21-byte
	// names of a short Service's endpoints (SRV targets are never
	// compressed, RFC 2782): 80 addresses and 40 endpoints overflow it,
	// and keep the TCP answers small.
	const (
		addrName, addresses = "a.example.", 80
		srvName, endpoints  = "_agent._tcp.p.example.", 40
	)
	var ips []string
	for i := range addresses {
		ips = append(ips, net.IPv4(10, 1, 0, byte(i+1)).String())
	}
	rrs := dnstest.Headless("p.example.", "agent", "tcp", 8091, ips[:endpoints]...)
	for _, ip := range ips {
		rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: addrName, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)})
	}
	srv.SetRecords(rrs...)
	for _, tc := range []struct {
		name string
		want int
	}{{addrName, addresses}, {srvName, endpoints}} {
		res, err := newCounter(t, srv, tc.name).Count(t.Context())
		require.NoError(t, err)
		assert.Equal(t, tc.want, res.Count, tc.name)
		assert.Equal(t, servercounter.TransportUDPThenTCP, res.Transport, tc.name)
		assert.False(t, res.Truncated, tc.name)
	}
	assert.Positive(t, srv.Queries("tcp"))
}

func TestDNSCountTruncatedOverTCPIsLowerBound(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultTruncate})
	res, err := newCounter(t, srv, "_agent._tcp."+svc).Count(t.Context())
	require.NoError(t, err, "a truncated answer is a lower bound, not an error")
	assert.Equal(t, 1, res.Count)
	assert.True(t, res.Truncated)
	assert.Equal(t, servercounter.TransportUDPThenTCP, res.Transport)
}

func TestDNSCountHugeAnswerIsClamped(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	// SRV targets are never compressed (RFC 2782), so a record whose
	// target is as long as a DNS name can be, 255 bytes on the wire,
	// takes 273: TCP's 64 KiB carries 239 of 256 and overflows, as with
	// thousands of A records, for a fraction of the work. The longer the
	// targets, the fewer records fill those bytes.
	const records = 256
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." +
		strings.Repeat("d", 44) + ".example."
	rrs := make([]dns.RR, 0, records)
	for i := range records {
		rrs = append(rrs, &dns.SRV{
			Hdr:    dns.RR_Header{Name: "_a._tcp." + svc, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 30},
			Port:   8091,
			Target: fmt.Sprintf("pod-%04d.%s", i, long),
		})
	}
	srv.SetRecords(rrs...)
	c := newCounter(t, srv, "_a._tcp."+svc, func(c *servercounter.Config) { c.Type, c.Max = servercounter.TypeSRV, 100 })
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 100, res.Count)
	assert.Greater(t, res.Found, 100, "TCP carries hundreds of these records")
	assert.Less(t, res.Found, records, "64 KiB cannot carry them all")
	assert.True(t, res.Truncated, "64 KiB cannot carry 256 records of 273 bytes")
	assert.Equal(t, servercounter.TransportUDPThenTCP, res.Transport)
}

func TestDNSCountMinClamp(t *testing.T) {
	t.Parallel()
	res, err := newCounterAt(t, headless3Shared.addr(t), "gone.kube-system.svc.cluster.local.", func(c *servercounter.Config) { c.Min = 1 }).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, res.Count)
	assert.Equal(t, 0, res.Found)
	assert.Equal(t, servercounter.OutcomeNXDomain, res.Outcome)
}

func TestDNSCountOverTCP(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	res, err := newCounter(t, srv, svc, func(c *servercounter.Config) { c.TCP = true }).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, res.Count)
	assert.Equal(t, servercounter.TransportTCP, res.Transport)
	assert.Zero(t, srv.Queries("udp"))
}

func TestDNSCountLogsChangesOnly(t *testing.T) {
	t.Parallel()
	srv := newHeadless3Server(t)
	logger, buf := logtest.NewLogger(2)
	ctx := klog.NewContext(t.Context(), logger)
	// One query per count: what is logged is under test, not the type.
	c := newCounter(t, srv, svc, func(c *servercounter.Config) { c.Attempts, c.Type = 1, servercounter.TypeA })
	// Two counts of each state: the second must log nothing.
	const repeats = 2
	for range repeats {
		_, err := c.Count(ctx)
		require.NoError(t, err)
	}
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	for range repeats {
		_, err := c.Count(ctx)
		require.Error(t, err)
	}
	srv.ClearFault()
	srv.SetRecords()
	for range repeats {
		_, err := c.Count(ctx)
		require.NoError(t, err)
	}
	out := buf.String()
	assert.Equal(t, 1, strings.Count(out, "DNS server count failed"), out)
	assert.Equal(t, 1, strings.Count(out, "DNS server count recovered"), out)
}

func TestNewDNSServerCounterRejectsBadConfig(t *testing.T) {
	t.Parallel()
	resolv := emptyResolvConf(t)
	tests := []struct {
		name    string
		cfg     servercounter.Config
		wantErr []string
	}{
		{name: "no name", cfg: servercounter.Config{Servers: []string{"127.0.0.1"}}, wantErr: []string{"no name to count"}},
		{name: "bad name", cfg: servercounter.Config{Name: "a..b", Servers: []string{"127.0.0.1"}}, wantErr: []string{`invalid name "a..b"`}},
		{name: "label too long", cfg: servercounter.Config{Name: strings.Repeat("x", 64) + ".example.", Servers: []string{"127.0.0.1"}}, wantErr: []string{"invalid name"}},
		{name: "bad server", cfg: servercounter.Config{Name: "a.b", Servers: []string{"10.0.0.1:dns"}}, wantErr: []string{`invalid nameserver "10.0.0.1:dns"`}},
		{name: "bad clamp", cfg: servercounter.Config{Name: "a.b", Servers: []string{"127.0.0.1"}, Min: 5, Max: 2}, wantErr: []string{"invalid maximum count 2: below the minimum count 5"}},
		{name: "bad type", cfg: servercounter.Config{Name: "a.b", Servers: []string{"127.0.0.1"}, Type: 42}, wantErr: []string{"invalid record type"}},
		{name: "every problem at once", cfg: servercounter.Config{Name: "a..b", Servers: []string{"[::1"}, Attempts: -1, Timeout: -1},
			wantErr: []string{"invalid name", "invalid nameserver", "invalid attempts", "invalid timeout"}},
		{name: "no nameservers", cfg: servercounter.Config{Name: "a.b", ResolvConf: resolv}, wantErr: []string{"no nameservers"}},
		{name: "missing resolv.conf", cfg: servercounter.Config{Name: "a.b", ResolvConf: "/nonexistent/resolv.conf"}, wantErr: []string{"read resolv.conf", "/nonexistent/resolv.conf"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.cfg.ResolvConf == "" {
				tc.cfg.ResolvConf = resolv
			}
			_, err := servercounter.NewDNSServerCounter(tc.cfg)
			require.Error(t, err)
			for _, w := range tc.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// Validate finds what NewDNSServerCounter would, short of resolv.conf,
// each problem a *ConfigError naming its field, so that a caller with
// flags can name the flag.
func TestConfigValidateNamesEachField(t *testing.T) {
	t.Parallel()
	require.NoError(t, servercounter.Config{Name: "proxy"}.Validate(), "zero fields mean their defaults")
	err := servercounter.Config{Name: "a..b", Servers: []string{"10.0.0.1:53", "bad host"}, Min: 3, Max: 2, Attempts: -1, Type: 9}.Validate()
	require.Error(t, err)
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *servercounter.ConfigError
		require.ErrorAs(t, e, &ce)
		fields = append(fields, ce.Field+"="+ce.Value)
	}
	assert.Equal(t, []string{`Name="a..b"`, "Type=9", "Attempts=-1", "Max=2", `Servers="bad host"`}, fields)
	assert.ErrorContains(t, err, `servercounter: invalid nameserver "bad host": want host:port or host, e.g. 10.96.0.10:53`)
}

func TestNewDNSServerCounterReadsResolvConf(t *testing.T) {
	t.Parallel()
	const resolv = "testdata/nameservers.resolv.conf"
	c, err := servercounter.NewDNSServerCounter(servercounter.Config{Name: "proxy", ResolvConf: resolv})
	require.NoError(t, err)
	assert.Equal(t, []string{"10.96.0.10:53", "[fd00::10]:53"}, c.Servers())
	assert.Equal(t, []string{"proxy.ns.svc.cluster.local.", "proxy."}, c.Names())
	assert.Equal(t, servercounter.TypeIP, c.Type())

	c, err = servercounter.NewDNSServerCounter(servercounter.Config{Name: "_a._tcp.proxy", ResolvConf: resolv, Servers: []string{"127.0.0.1:5353", "::1"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:5353", "[::1]:53"}, c.Servers())
	assert.Equal(t, servercounter.TypeSRV, c.Type())
}

func TestParseRecordType(t *testing.T) {
	t.Parallel()
	for _, typ := range []servercounter.RecordType{servercounter.TypeAuto, servercounter.TypeSRV, servercounter.TypeA, servercounter.TypeAAAA, servercounter.TypeIP} {
		got, err := servercounter.ParseRecordType(strings.ToUpper(typ.String()))
		require.NoError(t, err)
		assert.Equal(t, typ, got)
	}
	_, err := servercounter.ParseRecordType("mx")
	assert.ErrorContains(t, err, `unknown record type "mx": use one of auto, srv, a, aaaa, ip`)
}

func TestRecordTypeDNSTypes(t *testing.T) {
	t.Parallel()
	for typ, want := range map[servercounter.RecordType][]uint16{
		servercounter.TypeAuto: {dns.TypeA, dns.TypeAAAA},
		servercounter.TypeIP:   {dns.TypeA, dns.TypeAAAA},
		servercounter.TypeSRV:  {dns.TypeSRV},
		servercounter.TypeA:    {dns.TypeA},
		servercounter.TypeAAAA: {dns.TypeAAAA},
	} {
		assert.Equal(t, want, typ.DNSTypes(), typ.String())
	}
}

// closedUDPAddr returns a loopback address where nothing listens.
func closedUDPAddr(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := pc.LocalAddr().String()
	require.NoError(t, pc.Close())
	return addr
}

func TestResultEndpoints(t *testing.T) {
	t.Parallel()
	// headless3 has targets and addresses at s.example. out of order, and
	// one target of each family.
	addr := headless3Shared.addr(t)
	res, err := newCounterAt(t, addr, "_agent._tcp.s.example.").Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:8092", "10.0.0.2:8091", "[fd00::1]:8091"}, res.Endpoints(1))

	res, err = newCounterAt(t, addr, "s.example.", func(c *servercounter.Config) { c.Type = servercounter.TypeA }).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.10:9000", "10.0.0.1:9000", "10.0.0.9:9000"}, res.Endpoints(9000), "sorted as strings")
}
