package servercounter

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// FuzzClassify feeds classify every reply the fuzzer can unpack, asked
// the reply's own question so that the checks past it are reached. It
// must not panic, never keep more records than the answer holds, and
// never follow more CNAMEs than resolvers do.
func FuzzClassify(f *testing.F) {
	for _, r := range seedReplies() {
		b, err := r.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// classify shares nothing between inputs, so the seeds and the
		// corpus run in parallel under go test (fuzzing ignores this).
		t.Parallel()
		r := new(dns.Msg)
		if r.Unpack(data) != nil {
			return
		}
		q := dns.Question{Name: "s.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}
		if len(r.Question) == 1 {
			q = r.Question[0]
		}
		a, _, hops, err := classify(q, r)
		if err != nil {
			return
		}
		if len(a.rrs) > len(r.Answer) {
			t.Fatalf("kept %d records of an answer of %d", len(a.rrs), len(r.Answer))
		}
		if hops > maxCNAMEs {
			t.Fatalf("followed %d CNAMEs, more than %d", hops, maxCNAMEs)
		}
		if a.outcome == OutcomeNone {
			t.Fatal("a reply classified without error has no outcome")
		}
	})
}

// seedReplies are replies of each shape a count meets: records of each
// type, a CNAME chain, NXDOMAIN with an SOA, NODATA, SERVFAIL.
func seedReplies() []*dns.Msg {
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: 30}
	}
	reply := func(name string, t uint16, rcode int, rrs ...dns.RR) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(name, t)
		m.Response, m.Rcode, m.Answer = true, rcode, rrs
		return m
	}
	soa := &dns.SOA{Hdr: hdr("example.", dns.TypeSOA), Ns: "ns.example.", Mbox: "h.example.", Minttl: 5}
	nx := reply("s.example.", dns.TypeA, dns.RcodeNameError)
	nx.Ns = []dns.RR{soa}
	srv := reply("_a._tcp.s.example.", dns.TypeSRV, dns.RcodeSuccess,
		&dns.SRV{Hdr: hdr("_a._tcp.s.example.", dns.TypeSRV), Port: 8091, Target: "p1.s.example."},
		&dns.SRV{Hdr: hdr("_a._tcp.s.example.", dns.TypeSRV), Port: 8092, Target: "p1.s.example."},
		&dns.SRV{Hdr: hdr("_a._tcp.s.example.", dns.TypeSRV), Port: 8091, Target: "."})
	srv.Extra = []dns.RR{&dns.A{Hdr: hdr("p1.s.example.", dns.TypeA), A: net.IPv4(10, 0, 0, 1)}}
	return []*dns.Msg{
		reply("s.example.", dns.TypeA, dns.RcodeSuccess,
			&dns.A{Hdr: hdr("s.example.", dns.TypeA), A: net.IPv4(10, 0, 0, 1)},
			&dns.A{Hdr: hdr("s.example.", dns.TypeA), A: net.IPv4(10, 0, 0, 2)}),
		reply("s.example.", dns.TypeAAAA, dns.RcodeSuccess,
			&dns.AAAA{Hdr: hdr("s.example.", dns.TypeAAAA), AAAA: net.ParseIP("fd00::1")}),
		srv,
		reply("s.example.", dns.TypeA, dns.RcodeSuccess,
			&dns.CNAME{Hdr: hdr("s.example.", dns.TypeCNAME), Target: "t.example."},
			&dns.A{Hdr: hdr("t.example.", dns.TypeA), A: net.IPv4(10, 0, 0, 3)}),
		reply("s.example.", dns.TypeA, dns.RcodeSuccess,
			&dns.CNAME{Hdr: hdr("s.example.", dns.TypeCNAME), Target: "s.example."}),
		nx,
		reply("s.example.", dns.TypeA, dns.RcodeSuccess),
		reply("s.example.", dns.TypeA, dns.RcodeServerFailure),
	}
}
