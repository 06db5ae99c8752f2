package dnstest

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

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
			panic(fmt.Sprintf("dnstest: SRVRecords(%q): %v", name, err))
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
