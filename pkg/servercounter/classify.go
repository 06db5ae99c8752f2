package servercounter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/miekg/dns"
)

// failure is why one exchange gave no usable answer. Count turns it into a
// *DNSError.
type failure struct {
	kind  ErrorKind
	rcode int
	err   error
}

func (f *failure) Error() string {
	if f.err != nil {
		return f.err.Error()
	}
	return f.kind.String()
}

func (f *failure) Unwrap() error { return f.err }

// classify is the one place where a reply gets its meaning: records, a
// valid zero (NXDOMAIN, NODATA), or a failure. It checks that r
// answers q, follows the CNAMEs in r's answer, and returns the name the
// chain ends at and how many CNAMEs it followed.
func classify(q dns.Question, r *dns.Msg) (a answer, target string, hops int, _ error) {
	if !r.Response || r.Opcode != dns.OpcodeQuery {
		return a, "", 0, &failure{kind: ErrorMalformed, rcode: -1, err: errors.New("reply is not a response to a query")}
	}
	if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Name) ||
		r.Question[0].Qtype != q.Qtype || r.Question[0].Qclass != q.Qclass {
		return a, "", 0, &failure{kind: ErrorMalformed, rcode: -1, err: fmt.Errorf("reply answers another question than %s %s", q.Name, dns.TypeToString[q.Qtype])}
	}
	a.rcode = r.Rcode
	a.truncated = r.Truncated
	switch r.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
	case dns.RcodeRefused:
		return a, "", 0, &failure{kind: ErrorRefused, rcode: r.Rcode}
	default:
		return a, "", 0, &failure{kind: ErrorServerFailure, rcode: r.Rcode}
	}

	var loop bool
	a.rrs, target, a.ttl, hops, loop = follow(r.Answer, q.Name, q.Qtype)
	if loop {
		return a, "", 0, errCNAMELoop
	}
	switch {
	case len(a.rrs) > 0:
		a.outcome = OutcomeRecords
		if q.Qtype == dns.TypeSRV {
			a.extra = glue(r.Extra, a.rrs)
		}
		return a, target, hops, nil
	case r.Rcode == dns.RcodeNameError:
		a.outcome = OutcomeNXDomain
	default:
		a.outcome = OutcomeNoData
	}
	// RFC 2308: a negative answer may be cached for the smaller of the
	// SOA's TTL and its MINIMUM field.
	a.ttl = 0
	for _, rr := range r.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			a.ttl = min(soa.Hdr.Ttl, soa.Minttl)
			break
		}
	}
	return a, target, hops, nil
}

// errCNAMELoop fails an answer whose CNAME chain is longer than resolvers
// follow, as a loop is: it is broken DNS, not zero servers.
var errCNAMELoop = &failure{kind: ErrorMalformed, rcode: -1, err: fmt.Errorf("CNAME chain longer than %d names (a loop?)", maxCNAMEs)}

// exchangeFailure classifies an error from sending a query or reading its
// reply.
func exchangeFailure(err error) *failure {
	var (
		ne net.Error
		de *dns.Error
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &ne) && ne.Timeout():
		return &failure{kind: ErrorTimeout, rcode: -1, err: err}
	case errors.As(err, &de):
		// miekg/dns returns *dns.Error for replies that do not unpack.
		return &failure{kind: ErrorMalformed, rcode: -1, err: err}
	}
	return &failure{kind: ErrorNetwork, rcode: -1, err: err}
}

// follow returns the qtype records that answer name in section, following
// CNAMEs (at most maxCNAMEs); loop reports that the limit cut a chain
// short. Records owned by other names, of another class, or without the
// data a count needs (an empty SRV target, an address of the wrong length)
// are ignored: an answer only counts for the question asked. ttl is the
// smallest TTL of the records and CNAMEs used.
func follow(section []dns.RR, name string, qtype uint16) (rrs []dns.RR, target string, ttl uint32, hops int, loop bool) {
	target = name
	ttl = ^uint32(0)
	for {
		var cname *dns.CNAME
		for _, rr := range section {
			if rr.Header().Class != dns.ClassINET || !owns(rr, target) {
				continue
			}
			if rr.Header().Rrtype == qtype && usable(rr) {
				rrs = append(rrs, rr)
				ttl = min(ttl, rr.Header().Ttl)
			} else if c, ok := rr.(*dns.CNAME); ok && cname == nil {
				cname = c
			}
		}
		if len(rrs) > 0 || cname == nil || hops >= maxCNAMEs {
			if len(rrs) == 0 {
				ttl = 0
			}
			return rrs, target, ttl, hops, len(rrs) == 0 && cname != nil
		}
		ttl = min(ttl, cname.Hdr.Ttl)
		target = strings.ToLower(cname.Target)
		hops++
	}
}

// usable reports whether rr carries what a count needs. miekg/dns unpacks
// a record with empty data into a zero value of its type.
func usable(rr dns.RR) bool {
	switch rr := rr.(type) {
	case *dns.SRV:
		return rr.Target != ""
	case *dns.A:
		return rr.A.To4() != nil
	case *dns.AAAA:
		return len(rr.AAAA) == net.IPv6len
	}
	return false
}

// glue returns the A and AAAA records in extra that belong to the targets
// of srvs.
func glue(extra, srvs []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range extra {
		t := rr.Header().Rrtype
		if t != dns.TypeA && t != dns.TypeAAAA {
			continue
		}
		for _, s := range srvs {
			if srv, ok := s.(*dns.SRV); ok && owns(rr, srv.Target) {
				out = append(out, rr)
				break
			}
		}
	}
	return out
}
