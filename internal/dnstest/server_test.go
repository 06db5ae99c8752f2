package dnstest

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Timeouts for the test client: long enough never to fire on a server that
// answers, short enough to keep tests that expect no answer quick.
const (
	answerTimeout   = 5 * time.Second
	noAnswerTimeout = 200 * time.Millisecond
)

// networks are the transports every server serves.
var networks = []string{"udp", "tcp"}

// testZone is the data most tests serve.
const testZone = `
$ORIGIN example.
www            A     192.0.2.1
www            A     192.0.2.2
v6             AAAA  2001:db8::1
alias          CNAME alias2
alias2         CNAME www
dangling       CNAME nowhere
loop1          CNAME loop2
loop2          CNAME loop1
_dns._udp.svc  SRV   0 50 53 ns1.svc
_dns._udp.svc  SRV   0 50 53 ns2.svc
ns1.svc        A     192.0.2.53
ns2.svc        AAAA  2001:db8::53
txtonly        TXT   "hello"
a.b.deep       A     192.0.2.9
`

// query returns a query for name and qtype.
func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// exchange sends m to s over network and returns the reply.
func exchange(t testing.TB, s *Server, network string, m *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: timeout}
	r, _, err := c.ExchangeContext(t.Context(), m, s.Addr())
	return r, err
}

// mustExchange is exchange for queries that must be answered.
func mustExchange(t testing.TB, s *Server, network string, m *dns.Msg) *dns.Msg {
	t.Helper()
	r, err := exchange(t, s, network, m, answerTimeout)
	require.NoError(t, err, "query %s over %s", m.Question[0].String(), network)
	return r
}

// rrStrings returns the presentation form of rrs, sorted so that the order
// records are served in does not matter.
func rrStrings(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		out = append(out, rr.String())
	}
	slices.Sort(out)
	return out
}

// zoneStrings parses zone text the way SetZone does and returns rrStrings of
// the result.
func zoneStrings(t testing.TB, text string) []string {
	t.Helper()
	rrs, err := ParseZone(text)
	require.NoError(t, err)
	return rrStrings(rrs)
}

func TestStart(t *testing.T) {
	t.Parallel()
	s, err := Start()
	require.NoError(t, err)

	host, port, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	assert.NotZero(t, p)

	// Both transports answer on the one address right after Start.
	for _, network := range networks {
		r := mustExchange(t, s, network, query("www.example.", dns.TypeA))
		assert.Equal(t, dns.RcodeNameError, r.Rcode, "empty server over %s", network)
	}

	require.NoError(t, s.Close())
	assert.NoError(t, s.Close(), "second Close")
}

func TestServer_answers(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, testZone)

	tests := []struct {
		name       string
		qname      string
		qtype      uint16
		wantRcode  int
		wantAnswer string // zone text
		wantExtra  string // zone text
		wantSOA    bool
	}{
		{
			name:       "A",
			qname:      "www.example.",
			qtype:      dns.TypeA,
			wantRcode:  dns.RcodeSuccess,
			wantAnswer: "www.example. 30 IN A 192.0.2.1\nwww.example. 30 IN A 192.0.2.2",
		},
		{
			name:       "name compared case-insensitively",
			qname:      "WWW.Example.",
			qtype:      dns.TypeA,
			wantRcode:  dns.RcodeSuccess,
			wantAnswer: "www.example. 30 IN A 192.0.2.1\nwww.example. 30 IN A 192.0.2.2",
		},
		{
			name:       "AAAA",
			qname:      "v6.example.",
			qtype:      dns.TypeAAAA,
			wantRcode:  dns.RcodeSuccess,
			wantAnswer: "v6.example. 30 IN AAAA 2001:db8::1",
		},
		{
			name:      "SRV with glue",
			qname:     "_dns._udp.svc.example.",
			qtype:     dns.TypeSRV,
			wantRcode: dns.RcodeSuccess,
			wantAnswer: "_dns._udp.svc.example. 30 IN SRV 0 50 53 ns1.svc.example.\n" +
				"_dns._udp.svc.example. 30 IN SRV 0 50 53 ns2.svc.example.",
			wantExtra: "ns1.svc.example. 30 IN A 192.0.2.53\nns2.svc.example. 30 IN AAAA 2001:db8::53",
		},
		{
			name:      "CNAME chain",
			qname:     "alias.example.",
			qtype:     dns.TypeA,
			wantRcode: dns.RcodeSuccess,
			wantAnswer: "alias.example. 30 IN CNAME alias2.example.\n" +
				"alias2.example. 30 IN CNAME www.example.\n" +
				"www.example. 30 IN A 192.0.2.1\nwww.example. 30 IN A 192.0.2.2",
		},
		{
			name:       "CNAME asked for",
			qname:      "alias.example.",
			qtype:      dns.TypeCNAME,
			wantRcode:  dns.RcodeSuccess,
			wantAnswer: "alias.example. 30 IN CNAME alias2.example.",
		},
		{
			name:      "CNAME chain to NODATA",
			qname:     "alias.example.",
			qtype:     dns.TypeAAAA,
			wantRcode: dns.RcodeSuccess,
			wantAnswer: "alias.example. 30 IN CNAME alias2.example.\n" +
				"alias2.example. 30 IN CNAME www.example.",
			wantSOA: true,
		},
		{
			name:       "CNAME to a missing name",
			qname:      "dangling.example.",
			qtype:      dns.TypeA,
			wantRcode:  dns.RcodeNameError,
			wantAnswer: "dangling.example. 30 IN CNAME nowhere.example.",
			wantSOA:    true,
		},
		{
			name:      "NXDOMAIN",
			qname:     "nope.example.",
			qtype:     dns.TypeA,
			wantRcode: dns.RcodeNameError,
			wantSOA:   true,
		},
		{
			name:      "NXDOMAIN below an existing name",
			qname:     "x.www.example.",
			qtype:     dns.TypeA,
			wantRcode: dns.RcodeNameError,
			wantSOA:   true,
		},
		{
			name:      "NODATA",
			qname:     "txtonly.example.",
			qtype:     dns.TypeA,
			wantRcode: dns.RcodeSuccess,
			wantSOA:   true,
		},
		{
			name:      "empty non-terminal NODATA",
			qname:     "b.deep.example.",
			qtype:     dns.TypeA,
			wantRcode: dns.RcodeSuccess,
			wantSOA:   true,
		},
		{
			name:      "empty non-terminal NODATA two levels up",
			qname:     "Deep.example.",
			qtype:     dns.TypeTXT,
			wantRcode: dns.RcodeSuccess,
			wantSOA:   true,
		},
	}
	for _, tc := range tests {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				t.Parallel()
				r := mustExchange(t, s, network, query(tc.qname, tc.qtype))

				assert.Equal(t, dns.RcodeToString[tc.wantRcode], dns.RcodeToString[r.Rcode], "rcode")
				assert.True(t, r.Authoritative, "AA bit")
				assert.False(t, r.Truncated, "TC bit")
				require.Len(t, r.Question, 1)
				assert.Equal(t, tc.qname, r.Question[0].Name, "question echoed")
				assert.Equal(t, zoneStrings(t, tc.wantAnswer), rrStrings(r.Answer), "answer")
				assert.Equal(t, zoneStrings(t, tc.wantExtra), rrStrings(r.Extra), "additional")
				if !tc.wantSOA {
					assert.Empty(t, r.Ns, "authority")
					return
				}
				require.Len(t, r.Ns, 1, "authority")
				soa, ok := r.Ns[0].(*dns.SOA)
				require.True(t, ok, "authority holds %T, want *dns.SOA", r.Ns[0])
				assert.Equal(t, "ns.dnstest.", soa.Ns)
				assert.Equal(t, "hostmaster.dnstest.", soa.Mbox)
				assert.Equal(t, uint32(5), soa.Hdr.Ttl, "SOA TTL")
				assert.Equal(t, uint32(5), soa.Minttl, "SOA minimum")
			})
		}
	}
}

func TestServer_cnameLoop(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, testZone)

	r := mustExchange(t, s, "udp", query("loop1.example.", dns.TypeA))
	assert.Equal(t, dns.RcodeSuccess, r.Rcode)
	assert.Len(t, r.Answer, maxCNAMEChain, "the chain stops after maxCNAMEChain CNAMEs")
	for _, rr := range r.Answer {
		assert.IsType(t, &dns.CNAME{}, rr)
	}
}

func TestServer_edns0(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, testZone)

	tests := []struct {
		name     string
		udpSize  uint16 // 0: no EDNS0
		do       bool
		wantEDNS bool
	}{
		{name: "no EDNS0"},
		{name: "EDNS0 1232", udpSize: 1232, wantEDNS: true},
		{name: "EDNS0 4096 with DO", udpSize: 4096, do: true, wantEDNS: true},
	}
	for _, tc := range tests {
		for _, network := range networks {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				t.Parallel()
				m := query("www.example.", dns.TypeA)
				if tc.udpSize != 0 {
					m.SetEdns0(tc.udpSize, tc.do)
				}
				r := mustExchange(t, s, network, m)
				opt := r.IsEdns0()
				if !tc.wantEDNS {
					assert.Nil(t, opt)
					return
				}
				require.NotNil(t, opt, "OPT record echoed")
				assert.Equal(t, tc.udpSize, opt.UDPSize())
				assert.Equal(t, tc.do, opt.Do())
				assert.Len(t, r.Answer, 2)
			})
		}
	}
}

func TestServer_recordsReplacedWhileRunning(t *testing.T) {
	t.Parallel()
	s := NewServer(t)

	s.MustSetZone(t, "old.example. A 192.0.2.1")
	r := mustExchange(t, s, "udp", query("old.example.", dns.TypeA))
	assert.Equal(t, zoneStrings(t, "old.example. 30 IN A 192.0.2.1"), rrStrings(r.Answer))

	s.SetRecords(&dns.A{
		Hdr: dns.RR_Header{Name: "New.Example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
		A:   net.IPv4(192, 0, 2, 2),
	})
	r = mustExchange(t, s, "tcp", query("new.example.", dns.TypeA))
	assert.Equal(t, []string{"New.Example.\t60\tIN\tA\t192.0.2.2"}, rrStrings(r.Answer))
	r = mustExchange(t, s, "udp", query("old.example.", dns.TypeA))
	assert.Equal(t, dns.RcodeNameError, r.Rcode, "old records are gone")
}

func TestServer_recordsReplacedConcurrently(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, "www.example. A 192.0.2.0")

	// Queries and updates race on purpose; -race checks the server, and
	// every reply must hold exactly one of the values written.
	const updates = 50
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, network := range networks {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				r, err := exchange(t, s, network, query("www.example.", dns.TypeA), answerTimeout)
				if !assert.NoError(t, err) {
					return
				}
				if assert.Len(t, r.Answer, 1) {
					assert.True(t, strings.HasPrefix(r.Answer[0].String(), "www.example.\t30\tIN\tA\t192.0.2."),
						"got %s", r.Answer[0])
				}
			}
		})
	}
	for i := range updates {
		s.MustSetZone(t, fmt.Sprintf("www.example. A 192.0.2.%d", i))
	}
	close(done)
	wg.Wait()
}

func TestServer_SetZoneError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		zone     string
		wantLine string
	}{
		{name: "bad type", zone: "ok.example. A 192.0.2.1\nbad.example. NOTATYPE x", wantLine: "line: 2"},
		{name: "bad address", zone: "bad.example. A 192.0.2.300", wantLine: "line: 1"},
		{name: "include refused", zone: "ok.example. A 192.0.2.1\n\n$INCLUDE /etc/passwd", wantLine: "line: 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewServer(t)
			s.MustSetZone(t, "keep.example. A 192.0.2.1")

			err := s.SetZone(tc.zone)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.wantLine)
			var pe *dns.ParseError
			assert.ErrorAs(t, err, &pe, "the parser's error is wrapped")

			r := mustExchange(t, s, "udp", query("keep.example.", dns.TypeA))
			assert.Len(t, r.Answer, 1, "records kept after a failed SetZone")
		})
	}
}

func TestServer_faults(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond

	// Outcomes that several faults share. The zone holds 4 records.
	type check func(t *testing.T, r *dns.Msg, err error, rtt time.Duration)
	answered := func(t *testing.T, r *dns.Msg, err error, _ time.Duration) {
		require.NoError(t, err)
		assert.Equal(t, dns.RcodeSuccess, r.Rcode)
		assert.Len(t, r.Answer, 4)
	}
	failedWith := func(rcode string) check {
		return func(t *testing.T, r *dns.Msg, err error, _ time.Duration) {
			require.NoError(t, err)
			assert.Equal(t, rcode, dns.RcodeToString[r.Rcode])
			assert.Empty(t, r.Answer)
		}
	}
	timedOut := func(t *testing.T, _ *dns.Msg, err error, _ time.Duration) {
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	}
	truncatedInHalf := func(t *testing.T, r *dns.Msg, err error, _ time.Duration) {
		require.NoError(t, err)
		assert.True(t, r.Truncated, "TC bit")
		assert.Len(t, r.Answer, 2, "half of the 4 records")
	}
	unreadable := func(t *testing.T, _ *dns.Msg, err error, _ time.Duration) {
		require.Error(t, err)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	}

	tests := []struct {
		name    string
		fault   Fault
		network string
		timeout time.Duration // answerTimeout if zero
		check   check
	}{
		{name: "servfail", fault: Fault{Kind: FaultServFail}, network: "udp", check: failedWith("SERVFAIL")},
		{name: "refused", fault: Fault{Kind: FaultRefused}, network: "tcp", check: failedWith("REFUSED")},
		{name: "drop over udp times out", fault: Fault{Kind: FaultDrop}, network: "udp", timeout: noAnswerTimeout, check: timedOut},
		{name: "drop over tcp times out", fault: Fault{Kind: FaultDrop}, network: "tcp", timeout: noAnswerTimeout, check: timedOut},
		{
			name:    "slow answers after the delay",
			fault:   Fault{Kind: FaultSlow, Delay: delay},
			network: "udp",
			check: func(t *testing.T, r *dns.Msg, err error, rtt time.Duration) {
				answered(t, r, err, rtt)
				assert.GreaterOrEqual(t, rtt, delay)
			},
		},
		{name: "slow beyond the client timeout", fault: Fault{Kind: FaultSlow, Delay: time.Hour}, network: "tcp", timeout: noAnswerTimeout, check: timedOut},
		{name: "truncate over udp", fault: Fault{Kind: FaultTruncate}, network: "udp", check: truncatedInHalf},
		{name: "truncate over tcp", fault: Fault{Kind: FaultTruncate}, network: "tcp", check: truncatedInHalf},
		{
			name:    "wrong ID over tcp",
			fault:   Fault{Kind: FaultWrongID},
			network: "tcp",
			check: func(t *testing.T, _ *dns.Msg, err error, _ time.Duration) {
				assert.ErrorIs(t, err, dns.ErrId)
			},
		},
		// miekg's client skips UDP replies with another ID, taking them for
		// late replies to earlier queries.
		{name: "wrong ID over udp is ignored by the client", fault: Fault{Kind: FaultWrongID}, network: "udp", timeout: noAnswerTimeout, check: timedOut},
		{
			name:    "wrong question",
			fault:   Fault{Kind: FaultWrongQuestion},
			network: "udp",
			check: func(t *testing.T, r *dns.Msg, err error, _ time.Duration) {
				require.NoError(t, err)
				require.Len(t, r.Question, 1)
				assert.Equal(t, "wrong.example.", r.Question[0].Name)
				assert.Len(t, r.Answer, 4)
			},
		},
		{name: "garbage over udp", fault: Fault{Kind: FaultGarbage}, network: "udp", check: unreadable},
		{name: "garbage over tcp", fault: Fault{Kind: FaultGarbage}, network: "tcp", check: unreadable},
		{name: "none", fault: Fault{Kind: FaultNone}, network: "udp", check: answered},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewServer(t)
			s.MustSetZone(t, "www.example. A 192.0.2.1\nwww.example. A 192.0.2.2\n"+
				"www.example. A 192.0.2.3\nwww.example. A 192.0.2.4")
			s.SetFault(tc.fault)

			timeout := tc.timeout
			if timeout == 0 {
				timeout = answerTimeout
			}
			c := &dns.Client{Net: tc.network, Timeout: timeout}
			r, rtt, err := c.ExchangeContext(t.Context(), query("www.example.", dns.TypeA), s.Addr())
			tc.check(t, r, err, rtt)
		})
	}
}

func TestGarbageDoesNotUnpack(t *testing.T) {
	t.Parallel()
	var m dns.Msg
	assert.Error(t, m.Unpack(garbage(42)))
}

func TestServer_faultCount(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, "www.example. A 192.0.2.1")

	s.SetFault(Fault{Kind: FaultServFail, Count: 2})
	var got []string
	for range 4 {
		r := mustExchange(t, s, "udp", query("www.example.", dns.TypeA))
		got = append(got, dns.RcodeToString[r.Rcode])
	}
	assert.Equal(t, []string{"SERVFAIL", "SERVFAIL", "NOERROR", "NOERROR"}, got)

	// A new SetFault starts a new count.
	s.SetFault(Fault{Kind: FaultRefused, Count: 1})
	r := mustExchange(t, s, "tcp", query("www.example.", dns.TypeA))
	assert.Equal(t, "REFUSED", dns.RcodeToString[r.Rcode])
	r = mustExchange(t, s, "tcp", query("www.example.", dns.TypeA))
	assert.Equal(t, "NOERROR", dns.RcodeToString[r.Rcode])
}

func TestServer_faultNetwork(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		network   string
		wantRcode map[string]string // by query network
	}{
		{name: "udp only", network: "udp", wantRcode: map[string]string{"udp": "SERVFAIL", "tcp": "NOERROR"}},
		{name: "tcp only", network: "tcp", wantRcode: map[string]string{"udp": "NOERROR", "tcp": "SERVFAIL"}},
		{name: "both", network: "", wantRcode: map[string]string{"udp": "SERVFAIL", "tcp": "SERVFAIL"}},
		{name: "unknown network affects none", network: "sctp", wantRcode: map[string]string{"udp": "NOERROR", "tcp": "NOERROR"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewServer(t)
			s.MustSetZone(t, "www.example. A 192.0.2.1")
			s.SetFault(Fault{Kind: FaultServFail, Network: tc.network})
			for _, network := range networks {
				r := mustExchange(t, s, network, query("www.example.", dns.TypeA))
				assert.Equal(t, tc.wantRcode[network], dns.RcodeToString[r.Rcode], "over %s", network)
			}
		})
	}
}

func TestServer_faultReplacedAndCleared(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, "www.example. A 192.0.2.1")

	rcode := func() string {
		t.Helper()
		return dns.RcodeToString[mustExchange(t, s, "udp", query("www.example.", dns.TypeA)).Rcode]
	}
	s.SetFault(Fault{Kind: FaultServFail})
	assert.Equal(t, "SERVFAIL", rcode())
	assert.Equal(t, "SERVFAIL", rcode(), "Count 0 lasts until cleared")
	s.SetFault(Fault{Kind: FaultRefused})
	assert.Equal(t, "REFUSED", rcode(), "a new fault replaces the old one")
	s.ClearFault()
	assert.Equal(t, "NOERROR", rcode())
}

func TestServer_hugeAnswer(t *testing.T) {
	t.Parallel()
	const n = 10000
	rrs := make([]dns.RR, 0, n)
	for i := range n {
		rrs = append(rrs, &dns.A{
			Hdr: dns.RR_Header{Name: "big.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)),
		})
	}
	s := NewServer(t)
	s.SetRecords(rrs...)

	tests := []struct {
		name    string
		network string
		udpSize uint16 // 0: no EDNS0
		maxSize int
	}{
		{name: "udp without EDNS0", network: "udp", maxSize: dns.MinMsgSize},
		{name: "udp with EDNS0 1232", network: "udp", udpSize: 1232, maxSize: 1232},
		{name: "tcp", network: "tcp", maxSize: dns.MaxMsgSize},
		{name: "tcp with EDNS0 1232", network: "tcp", udpSize: 1232, maxSize: dns.MaxMsgSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := query("big.example.", dns.TypeA)
			if tc.udpSize != 0 {
				m.SetEdns0(tc.udpSize, false)
			}
			r := mustExchange(t, s, tc.network, m)

			assert.Equal(t, dns.RcodeSuccess, r.Rcode)
			assert.True(t, r.Truncated, "TC bit")
			assert.NotEmpty(t, r.Answer)
			assert.Less(t, len(r.Answer), n)
			r.Compress = true
			assert.LessOrEqual(t, r.Len(), tc.maxSize, "reply size")
			// Truncate drops only what does not fit, so little space is
			// left over.
			assert.Greater(t, r.Len(), tc.maxSize*9/10, "reply fills the size")
			t.Logf("%d records in %d bytes", len(r.Answer), r.Len())
		})
	}
}

// TestAnswerCopiesOnlyWhatFits checks that leaving out the records no
// message can carry changes no reply: each reply is the one a copy of every
// record gives once truncated.
func TestAnswerCopiesOnlyWhatFits(t *testing.T) {
	t.Parallel()
	var a []dns.RR
	for i := range 100000 {
		a = append(a, &dns.A{
			Hdr: dns.RR_Header{Name: "big.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)),
		})
	}
	var addrs []string
	for i := range 10000 {
		addrs = append(addrs, fmt.Sprintf("127.1.%d.%d:6443", i/250, 1+i%250))
	}
	srv := SRVRecords("_agent._tcp.big.example.", addrs...)
	r := newRecords(append(a, srv...))
	require.Greater(t, len(a), maxRRsInMsg)

	// full is the reply before the cap: every record of the set, and the
	// glue of every SRV target.
	full := func(req *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		q := req.Question[0]
		for _, rr := range r.sets[rrKey{name: canonical(q.Name), rrtype: q.Qtype}] {
			m.Answer = append(m.Answer, dns.Copy(rr))
		}
		for _, rr := range m.Answer {
			if s, ok := rr.(*dns.SRV); ok {
				for _, g := range r.sets[rrKey{name: canonical(s.Target), rrtype: dns.TypeA}] {
					m.Extra = append(m.Extra, dns.Copy(g))
				}
			}
		}
		return m
	}
	for _, q := range []*dns.Msg{query("big.example.", dns.TypeA), query("_agent._tcp.big.example.", dns.TypeSRV)} {
		for _, size := range []int{dns.MinMsgSize, 1232, dns.MaxMsgSize} {
			got := new(dns.Msg)
			r.answer(got, q)
			got.Truncate(size)
			want := full(q)
			want.Truncate(size)
			gotWire, err := got.Pack()
			require.NoError(t, err)
			wantWire, err := want.Pack()
			require.NoError(t, err)
			assert.True(t, got.Truncated, "%s in %d bytes: TC bit", q.Question[0].Name, size)
			assert.Equal(t, wantWire, gotWire, "%s in %d bytes", q.Question[0].Name, size)
		}
	}
}

func TestServer_Queries(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.SetFault(Fault{Kind: FaultRefused, Network: "tcp"})

	for range 3 {
		mustExchange(t, s, "udp", query("www.example.", dns.TypeA))
	}
	for range 2 {
		mustExchange(t, s, "tcp", query("www.example.", dns.TypeA))
	}

	tests := []struct {
		name    string
		network string
		want    int
	}{
		{name: "udp", network: "udp", want: 3},
		{name: "tcp, faulty queries included", network: "tcp", want: 2},
		{name: "both", network: "", want: 5},
		{name: "unknown network", network: "sctp", want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, s.Queries(tc.network))
		})
	}
}

func TestServer_CloseWithPendingFault(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		fault      Fault
		network    string
		wantAnswer bool
	}{
		{name: "slow over udp", fault: Fault{Kind: FaultSlow, Delay: time.Hour}, network: "udp", wantAnswer: true},
		{name: "slow over tcp", fault: Fault{Kind: FaultSlow, Delay: time.Hour}, network: "tcp", wantAnswer: true},
		{name: "drop over udp", fault: Fault{Kind: FaultDrop}, network: "udp"},
		{name: "drop over tcp", fault: Fault{Kind: FaultDrop}, network: "tcp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewServer(t)
			s.SetFault(tc.fault)

			type result struct {
				r   *dns.Msg
				err error
			}
			done := make(chan result, 1)
			go func() {
				// A dropped query is never answered; don't wait long.
				timeout := time.Second
				if tc.wantAnswer {
					timeout = answerTimeout
				}
				r, err := exchange(t, s, tc.network, query("www.example.", dns.TypeA), timeout)
				done <- result{r, err}
			}()
			require.Eventually(t, func() bool { return s.Queries(tc.network) == 1 },
				answerTimeout, time.Millisecond, "query reached the server")

			start := time.Now()
			require.NoError(t, s.Close())
			// Far below the fault's hour: Close did not wait for it.
			assert.Less(t, time.Since(start), answerTimeout, "Close took too long")

			got := <-done
			if !tc.wantAnswer {
				// A timeout, or over TCP the connection closing.
				assert.Error(t, got.err)
				return
			}
			// The slow answer went out when Close cut the delay short.
			require.NoError(t, got.err)
			assert.Equal(t, dns.RcodeNameError, got.r.Rcode)
		})
	}
}

func TestHeadless(t *testing.T) {
	t.Parallel()
	const svc = "proxy.kube-system.svc.cluster.local."
	got := Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2", "fd00::3")

	want := `
proxy.kube-system.svc.cluster.local.                    30 IN A    10.0.0.1
proxy.kube-system.svc.cluster.local.                    30 IN A    10.0.0.2
proxy.kube-system.svc.cluster.local.                    30 IN AAAA fd00::3
10-0-0-1.proxy.kube-system.svc.cluster.local.           30 IN A    10.0.0.1
10-0-0-2.proxy.kube-system.svc.cluster.local.           30 IN A    10.0.0.2
fd00--3.proxy.kube-system.svc.cluster.local.            30 IN AAAA fd00::3
_agent._tcp.proxy.kube-system.svc.cluster.local.        30 IN SRV  0 33 8091 10-0-0-1.proxy.kube-system.svc.cluster.local.
_agent._tcp.proxy.kube-system.svc.cluster.local.        30 IN SRV  0 33 8091 10-0-0-2.proxy.kube-system.svc.cluster.local.
_agent._tcp.proxy.kube-system.svc.cluster.local.        30 IN SRV  0 33 8091 fd00--3.proxy.kube-system.svc.cluster.local.
`
	assert.Equal(t, zoneStrings(t, want), rrStrings(got))

	// Served, the SRV answer carries every endpoint's address as glue.
	s := NewServer(t)
	s.SetRecords(got...)
	tests := []struct {
		name      string
		qname     string
		qtype     uint16
		wantCount int
		wantExtra int
	}{
		{name: "SRV", qname: "_agent._tcp." + svc, qtype: dns.TypeSRV, wantCount: 3, wantExtra: 3},
		{name: "A", qname: svc, qtype: dns.TypeA, wantCount: 2},
		{name: "AAAA", qname: svc, qtype: dns.TypeAAAA, wantCount: 1},
		{name: "endpoint", qname: "10-0-0-2." + svc, qtype: dns.TypeA, wantCount: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := mustExchange(t, s, "udp", query(tc.qname, tc.qtype))
			assert.Equal(t, dns.RcodeSuccess, r.Rcode)
			assert.Len(t, r.Answer, tc.wantCount)
			assert.Len(t, r.Extra, tc.wantExtra)
		})
	}
}

func TestHeadless_edgeCases(t *testing.T) {
	t.Parallel()
	assert.Empty(t, Headless("svc.example.", "p", "udp", 53), "no endpoints")

	one := Headless("svc.example", "dns", "udp", 53, "::ffff:192.0.2.7")
	assert.Equal(t, zoneStrings(t, `
svc.example.                  30 IN A   192.0.2.7
192-0-2-7.svc.example.        30 IN A   192.0.2.7
_dns._udp.svc.example.        30 IN SRV 0 100 53 192-0-2-7.svc.example.
`), rrStrings(one), "IPv4-mapped address served as A, relative svc made an FQDN")

	assert.PanicsWithValue(t, `dnstest: Headless("svc.example."): ParseAddr("not-an-ip"): unable to parse IP`,
		func() { Headless("svc.example.", "p", "tcp", 1, "not-an-ip") })
}

func TestFaultKind_String(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		kind FaultKind
		want string
	}{
		{name: "none", kind: FaultNone, want: "FaultNone"},
		{name: "servfail", kind: FaultServFail, want: "FaultServFail"},
		{name: "refused", kind: FaultRefused, want: "FaultRefused"},
		{name: "drop", kind: FaultDrop, want: "FaultDrop"},
		{name: "slow", kind: FaultSlow, want: "FaultSlow"},
		{name: "truncate", kind: FaultTruncate, want: "FaultTruncate"},
		{name: "wrong id", kind: FaultWrongID, want: "FaultWrongID"},
		{name: "wrong question", kind: FaultWrongQuestion, want: "FaultWrongQuestion"},
		{name: "garbage", kind: FaultGarbage, want: "FaultGarbage"},
		{name: "unknown", kind: FaultKind(42), want: "FaultKind(42)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.kind.String())
		})
	}
}

func TestServer_tcpConnectionReused(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	s.MustSetZone(t, "www.example. A 192.0.2.1")

	c := &dns.Client{Net: "tcp", Timeout: answerTimeout}
	conn, err := c.Dial(s.Addr())
	require.NoError(t, err)
	defer conn.Close()
	// More than miekg's default limit of 128 queries per connection.
	for i := range 200 {
		r, _, err := c.ExchangeWithConnContext(t.Context(), query("www.example.", dns.TypeA), conn)
		require.NoError(t, err, "query %d", i)
		require.Len(t, r.Answer, 1)
	}
	assert.Equal(t, 200, s.Queries("tcp"))
}
