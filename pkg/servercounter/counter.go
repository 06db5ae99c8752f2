package servercounter

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ServerCounter reports how many servers there are.
//
// CountServers must be safe for concurrent use and must not fail: an
// implementation that cannot learn the count answers the best it knows.
type ServerCounter interface {
	CountServers() int
}

// Counter is implemented by counters that can fail. Count blocks until it
// knows the count, the count cannot be learnt, or ctx is done. A nil error
// means Result.Count is the number of servers, zero included; an error
// means the count is unknown.
type Counter interface {
	Count(ctx context.Context) (Result, error)
}

// Notifier is implemented by counters that signal when their count
// changes, such as a [CachedServerCounter] that refreshes in the
// background, so that a client can act at once rather than on its next
// poll.
type Notifier interface {
	// Changed returns a channel that is closed when the count changes.
	// Call it again after each change for the next one; call it before
	// reading the count so that no change is missed.
	Changed() <-chan struct{}
}

// Refresher is implemented by counters that can be asked to count again
// now, such as a [CachedServerCounter]: a client with a reason to think
// the count out of date (a server it held went away, a dial to a listed
// address failed) asks, rather than wait for the count to expire.
type Refresher interface {
	// Refresh asks for a new count soon and returns at once. It never
	// makes the source be asked more often than the counter's own limits
	// allow: a burst of asks is one refresh.
	Refresh()
}

// Result is one count and what is known of where it came from. Fields other
// than Count and Source are set by counters that have them.
type Result struct {
	// Count is the number of servers, after any clamp.
	Count int
	// Found is the number of distinct servers in the answer, before any
	// clamp.
	Found int
	// Source says where Count came from.
	Source Source
	// Outcome says whether a DNS answer had records or was a valid zero;
	// OutcomeNone for a count that no DNS answer gave.
	Outcome Outcome
	// Name is the fully qualified name whose answer was counted: the one
	// asked for, or the one a search suffix made of it.
	Name string
	// Type is the record type that was counted.
	Type RecordType
	// TTL is the smallest TTL in the counted answer. For NXDOMAIN and NODATA
	// it is the negative-caching TTL of the SOA in the answer, or 0 without
	// one.
	TTL time.Duration
	// Truncated reports that the counted answer was truncated (even over
	// TCP, or TCP could not be reached): Count is a lower bound.
	Truncated bool
	// Partial reports, for TypeIP, that one address family failed and
	// Count comes from the other: a lower bound.
	Partial bool
	// Rcode is the DNS response code of the counted answer.
	Rcode int
	// Server is the nameserver (host:port) that answered.
	Server string
	// Transport is how the answer arrived.
	Transport Transport
	// Duration is how long the count took, retries included.
	Duration time.Duration
	// At is when the count was learnt.
	At time.Time
	// Answer holds the counted records, sorted: SRV, A or AAAA records,
	// without the CNAMEs that led to them.
	Answer []dns.RR
	// Extra holds the addresses of SRV targets that the server sent along
	// (glue), sorted.
	Extra []dns.RR
}

// Source says where a count came from.
type Source int

// Sources of a count.
const (
	// SourceStatic is a configured number.
	SourceStatic Source = iota + 1
	// SourceDNS is a DNS answer.
	SourceDNS
	// SourceFallback is the number a cache answers before it has learnt a
	// count.
	SourceFallback
	// SourceLeases is a count of valid Kubernetes Leases.
	SourceLeases
)

var sourceNames = map[Source]string{
	SourceStatic:   "static",
	SourceDNS:      "dns",
	SourceFallback: "fallback",
	SourceLeases:   "leases",
}

// String returns the lower-case name of s, as used in logs and metrics.
func (s Source) String() string {
	if n, ok := sourceNames[s]; ok {
		return n
	}
	return "unknown"
}

// Outcome classifies a DNS answer that was not an error.
type Outcome int

// Outcomes of a DNS count.
const (
	// OutcomeNone means no DNS answer gave the count: it is static, or a
	// cache's fallback.
	OutcomeNone Outcome = iota
	// OutcomeRecords means the answer had records of the type asked for.
	OutcomeRecords
	// OutcomeNXDomain means the name does not exist. Kubernetes DNS answers
	// NXDOMAIN for a headless Service with no ready endpoint, and for an SRV
	// name with a port name the Service does not have.
	OutcomeNXDomain
	// OutcomeNoData means the name exists but has no records of the type
	// asked for.
	OutcomeNoData
)

// String returns "none", "records", "nxdomain" or "nodata".
func (o Outcome) String() string {
	switch o {
	case OutcomeNone:
		return "none"
	case OutcomeRecords:
		return "records"
	case OutcomeNXDomain:
		return "nxdomain"
	case OutcomeNoData:
		return "nodata"
	}
	return "unknown"
}

// Transport says how a DNS answer arrived.
type Transport int

// Transports of a DNS answer.
const (
	// TransportNone: no DNS exchange, as for a static count.
	TransportNone Transport = iota
	// TransportUDP: over UDP.
	TransportUDP
	// TransportTCP: over TCP, because TCP was asked for.
	TransportTCP
	// TransportUDPThenTCP: the UDP answer was truncated and the query was
	// repeated over TCP (RFC 7766).
	TransportUDPThenTCP
)

// String returns "udp", "tcp", "udp->tcp", or "none".
func (t Transport) String() string {
	switch t {
	case TransportUDP:
		return "udp"
	case TransportTCP:
		return "tcp"
	case TransportUDPThenTCP:
		return "udp->tcp"
	}
	return "none"
}

// StaticServerCounter is a fixed count, such as the --server-count flag.
// Its zero value counts zero servers.
type StaticServerCounter int

// CountServers returns n.
func (n StaticServerCounter) CountServers() int { return int(n) }

// Count returns n, with Source [SourceStatic]. It never fails.
func (n StaticServerCounter) Count(context.Context) (Result, error) {
	return Result{Count: int(n), Found: int(n), Source: SourceStatic}, nil
}

// Endpoints returns where each counted server listens, as ip:port, sorted
// and without duplicates: for SRV records the target's address, carried
// in the answer as glue, and the record's port; for A and AAAA records the
// address and defaultPort. A client can dial them directly instead of
// going through a load balancer. SRV targets whose address the answer did
// not carry (a truncated answer drops glue first) are left out rather than
// returned as names, which the client would resolve elsewhere.
func (r Result) Endpoints(defaultPort int) []string {
	glue := map[string][]string{}
	for _, rr := range r.Extra {
		switch rr := rr.(type) {
		case *dns.A:
			glue[strings.ToLower(rr.Hdr.Name)] = append(glue[strings.ToLower(rr.Hdr.Name)], rr.A.String())
		case *dns.AAAA:
			glue[strings.ToLower(rr.Hdr.Name)] = append(glue[strings.ToLower(rr.Hdr.Name)], rr.AAAA.String())
		}
	}
	seen := map[string]bool{}
	var out []string
	add := func(host string, port int) {
		hp := net.JoinHostPort(host, strconv.Itoa(port))
		if !seen[hp] {
			seen[hp] = true
			out = append(out, hp)
		}
	}
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.SRV:
			if rr.Target == "." || rr.Target == "" {
				continue
			}
			// One endpoint per server: an SRV target's first glue address.
			if addrs := glue[strings.ToLower(rr.Target)]; len(addrs) > 0 {
				add(addrs[0], int(rr.Port))
			}
		case *dns.A:
			add(rr.A.String(), defaultPort)
		case *dns.AAAA:
			add(rr.AAAA.String(), defaultPort)
		}
	}
	slices.Sort(out)
	return out
}
