package dnstest

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

const (
	// defaultTTL is the TTL of zone records that do not give one, and of
	// the records Headless builds; CoreDNS's kubernetes plugin also
	// defaults to 30 seconds.
	defaultTTL = 30

	// negativeTTL is the SOA TTL and minimum on NXDOMAIN and NODATA
	// answers, which bounds how long resolvers cache the denial (RFC 2308
	// section 5). CoreDNS's kubernetes plugin uses 5 seconds.
	negativeTTL = 5

	// maxCNAMEChain bounds how many CNAMEs an answer follows, so a loop in
	// the data ends.
	maxCNAMEChain = 8
)

// rrKey identifies an RRset: a lowercase owner name and a type.
type rrKey struct {
	name   string
	rrtype uint16
}

// records is an immutable snapshot of a server's data.
type records struct {
	sets map[rrKey][]dns.RR
	// names holds every owner name and all of its ancestors, so an empty
	// non-terminal (RFC 8499 section 7) is found with one lookup.
	names map[string]struct{}
}

// newRecords indexes copies of rrs.
func newRecords(rrs []dns.RR) *records {
	r := &records{
		sets:  make(map[rrKey][]dns.RR),
		names: make(map[string]struct{}),
	}
	for _, rr := range rrs {
		if rr == nil {
			continue
		}
		rr = dns.Copy(rr)
		h := rr.Header()
		name := canonical(h.Name)
		k := rrKey{name: name, rrtype: h.Rrtype}
		r.sets[k] = append(r.sets[k], rr)
		for off, end := 0, false; !end; off, end = dns.NextLabel(name, off) {
			r.names[name[off:]] = struct{}{}
		}
		r.names["."] = struct{}{}
	}
	return r
}

// canonical returns name as a lowercase FQDN, the form records are indexed
// by: DNS names compare case-insensitively (RFC 4343).
func canonical(name string) string {
	return strings.ToLower(dns.Fqdn(name))
}

// maxRRsInMsg is more records than any DNS message can carry: a record
// takes at least 11 bytes on the wire (a 1-byte root name, type, class,
// TTL and RDLENGTH, empty RDATA) and a message at most dns.MaxMsgSize
// (65535) bytes. A section holding this many always overflows, so
// serveDNS's Truncate drops the rest and sets TC whether or not they were
// there: they need not be copied. Copying all 100000 records of a huge set
// for every query took about 100 ms of CPU under the race detector, which
// on a loaded machine made clients with sub-second timeouts give up.
const maxRRsInMsg = dns.MaxMsgSize/11 + 1

// lookup returns copies of the first limit records of the RRset of type
// rrtype at name (all of them if it has fewer). They are copies because
// packing a message writes each record's Rdlength, and concurrent handlers
// must not share what they pack.
func (r *records) lookup(name string, rrtype uint16, limit int) []dns.RR {
	set := r.sets[rrKey{name: canonical(name), rrtype: rrtype}]
	if len(set) == 0 || limit <= 0 {
		return nil
	}
	set = set[:min(len(set), limit)]
	out := make([]dns.RR, len(set))
	for i, rr := range set {
		out[i] = dns.Copy(rr)
	}
	return out
}

// exists reports whether any record is at name or below it.
func (r *records) exists(name string) bool {
	_, ok := r.names[canonical(name)]
	return ok
}

// answer fills m with the authoritative reply to req, which has exactly one
// question.
func (r *records) answer(m *dns.Msg, req *dns.Msg) {
	m.SetReply(req)
	m.Authoritative = true
	q := req.Question[0]

	// Follow CNAMEs as an authoritative server does (RFC 1034 section
	// 4.3.2, step 3a): the chain goes into the answer, and the rcode is
	// that of the last name.
	name := q.Name
	for i := 0; ; i++ {
		if rrs := r.lookup(name, q.Qtype, maxRRsInMsg-len(m.Answer)); len(rrs) > 0 {
			m.Answer = append(m.Answer, rrs...)
			r.addGlue(m)
			return
		}
		cname := r.lookup(name, dns.TypeCNAME, 1)
		if len(cname) == 0 {
			break
		}
		if i == maxCNAMEChain {
			// Probably a loop. The client gets the chain so far and
			// NOERROR, as from a server that stops following, and can
			// query the last target itself.
			return
		}
		// A name with a CNAME has no other data (RFC 1034 section
		// 3.6.2), so only the first one counts.
		m.Answer = append(m.Answer, cname[0])
		name = cname[0].(*dns.CNAME).Target
	}

	// No data of the type at the end of the chain: NODATA if the name
	// exists, even as an empty non-terminal (RFC 8020 section 2), else
	// NXDOMAIN.
	if !r.exists(name) {
		m.Rcode = dns.RcodeNameError
	}
	m.Ns = append(m.Ns, soa())
}

// addGlue adds the address records of every SRV target in the answer to the
// additional section, sparing the client a lookup per target; RFC 2782 urges
// servers to do so.
func (r *records) addGlue(m *dns.Msg) {
	seen := make(map[string]bool)
	for _, rr := range m.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			continue
		}
		target := canonical(srv.Target)
		if seen[target] {
			continue
		}
		seen[target] = true
		m.Extra = append(m.Extra, r.lookup(target, dns.TypeA, maxRRsInMsg-len(m.Extra))...)
		m.Extra = append(m.Extra, r.lookup(target, dns.TypeAAAA, maxRRsInMsg-len(m.Extra))...)
	}
}

// soa returns the SOA record that goes in the authority section of NXDOMAIN
// and NODATA answers, so resolvers can cache the denial (RFC 2308 section 3).
func soa() *dns.SOA {
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: ".", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: negativeTTL},
		Ns:      "ns.dnstest.",
		Mbox:    "hostmaster.dnstest.",
		Serial:  1,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  negativeTTL,
	}
}

// ParseZone parses zone text the way [Server.SetZone] does: RFC 1035
// section 5 format, names relative to the root, a TTL of 30 seconds where a
// record gives none, and no $INCLUDE. A test that serves the same zone from
// many servers parses it once and hands each the records with
// [Server.SetRecords]: under the race detector, parsing a zone of a few
// dozen records costs about as much as starting a server.
func ParseZone(text string) ([]dns.RR, error) {
	zp := dns.NewZoneParser(strings.NewReader(text), ".", "")
	zp.SetDefaultTTL(defaultTTL)
	var rrs []dns.RR
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		rrs = append(rrs, rr)
	}
	if err := zp.Err(); err != nil {
		// miekg's ParseError already names the line and column.
		return nil, fmt.Errorf("dnstest: parse zone: %w", err)
	}
	return rrs, nil
}

// Headless returns the records Kubernetes DNS serves for a headless Service
// named svc (an FQDN such as "proxy.kube-system.svc.cluster.local.") whose
// ready endpoints have the given IPs and one named port, following the
// Kubernetes DNS-Based Service Discovery specification (kubernetes/dns,
// docs/specification.md) as CoreDNS implements it:
//
//   - an A or AAAA record per IP at svc;
//   - per endpoint, a hostname "<ip with . or : replaced by ->.<svc>" with its
//     A or AAAA record, the name CoreDNS gives endpoints without a hostname;
//   - an SRV record per endpoint at "_<portName>._<proto>.<svc>", with
//     priority 0, weight 100/len(ips), the port, and the endpoint's hostname
//     as target.
//
// All records have a TTL of 30 seconds. Headless panics if an IP does not
// parse, because the IPs are fixtures written into the test.
func Headless(svc, portName, proto string, port uint16, ips ...string) []dns.RR {
	svc = dns.Fqdn(svc)
	srvName := "_" + portName + "._" + proto + "." + svc

	var weight uint16
	if len(ips) > 0 {
		weight = uint16(100 / len(ips))
	}

	rrs := make([]dns.RR, 0, 3*len(ips))
	var hosts, srvs []dns.RR
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			panic(fmt.Sprintf("dnstest: Headless(%q): %v", svc, err))
		}
		ip = ip.Unmap()
		host := strings.NewReplacer(".", "-", ":", "-").Replace(ip.String()) + "." + svc
		rrs = append(rrs, addressRR(svc, ip))
		hosts = append(hosts, addressRR(host, ip))
		srvs = append(srvs, &dns.SRV{
			Hdr:      dns.RR_Header{Name: srvName, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: defaultTTL},
			Priority: 0,
			Weight:   weight,
			Port:     port,
			Target:   host,
		})
	}
	rrs = append(rrs, hosts...)
	return append(rrs, srvs...)
}

// addressRR returns the A or AAAA record for ip at name.
func addressRR(name string, ip netip.Addr) dns.RR {
	if ip.Is4() {
		return &dns.A{
			Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: defaultTTL},
			A:   ip.AsSlice(),
		}
	}
	return &dns.AAAA{
		Hdr:  dns.RR_Header{Name: name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: defaultTTL},
		AAAA: ip.AsSlice(),
	}
}
