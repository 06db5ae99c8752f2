package dnstest

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkExchange measures one query and reply against the local server,
// the floor under any client benchmark that uses it.
func BenchmarkExchange(b *testing.B) {
	s := NewServer(b)
	s.SetRecords(Headless("proxy.kube-system.svc.cluster.local.", "agent", "tcp", 8091,
		"10.0.0.1", "10.0.0.2", "10.0.0.3")...)

	for _, network := range networks {
		b.Run(network, func(b *testing.B) {
			c := &dns.Client{Net: network, Timeout: answerTimeout}
			conn, err := c.Dial(s.Addr())
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			m := query("_agent._tcp.proxy.kube-system.svc.cluster.local.", dns.TypeSRV)

			b.ReportAllocs()
			for b.Loop() {
				r, _, err := c.ExchangeWithConnContext(b.Context(), m, conn)
				if err != nil {
					b.Fatal(err)
				}
				if len(r.Answer) != 3 {
					b.Fatalf("got %d answers, want 3", len(r.Answer))
				}
			}
		})
	}
}

// BenchmarkAnswer measures building a reply without the network, to show the
// server's own share of an exchange.
func BenchmarkAnswer(b *testing.B) {
	rrs := make([]dns.RR, 0, 1000)
	for i := range 1000 {
		rrs = append(rrs, &dns.A{
			Hdr: dns.RR_Header{Name: "big.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A:   net.IPv4(10, 0, byte(i>>8), byte(i)),
		})
	}
	data := newRecords(rrs)
	req := query("big.example.", dns.TypeA)

	b.ReportAllocs()
	for b.Loop() {
		data.answer(new(dns.Msg), req)
	}
}
