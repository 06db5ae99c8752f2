package servercounter

import (
	"context"
	"strings"

	"github.com/miekg/dns"
)

// answer is what one name and type resolved to on one server, CNAMEs
// followed.
type answer struct {
	outcome   Outcome
	rrs       []dns.RR // records of the type asked for, at the end of the chain
	extra     []dns.RR // glue for SRV targets
	ttl       uint32
	rcode     int
	truncated bool
	transport Transport
}

// query asks server for qtype records of name. When the answer ends in a
// CNAME whose target it does not answer for, as an authoritative server
// outside the target's zone does, query asks again for the target, up to
// maxCNAMEs in all.
func (c *DNSServerCounter) query(ctx context.Context, server, name string, qtype uint16) (answer, error) {
	hops := 0
	for {
		r, transport, err := c.exchange(ctx, server, name, qtype)
		a, target, n, err := classify(dns.Question{Name: name, Qtype: qtype, Qclass: dns.ClassINET}, r, err)
		if err != nil {
			return answer{}, err
		}
		a.transport = transport
		hops += n
		if a.outcome != OutcomeNoData || target == name || hops >= maxCNAMEs {
			return a, nil
		}
		name = target
	}
}

// exchange sends one query and reads its answer, repeating it over TCP when
// the UDP answer is truncated (RFC 7766). Each exchange has its own timeout.
func (c *DNSServerCounter) exchange(ctx context.Context, server, name string, qtype uint16) (*dns.Msg, Transport, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(c.cfg.UDPSize, false)
	if c.cfg.TCP {
		r, err := c.exchangeOver(ctx, c.tcp, m, server)
		return r, TransportTCP, err
	}
	r, err := c.exchangeOver(ctx, c.udp, m, server)
	if err != nil || !r.Truncated {
		return r, TransportUDP, err
	}
	m.Id = dns.Id()
	r, err = c.exchangeOver(ctx, c.tcp, m, server)
	return r, TransportUDPThenTCP, err
}

func (c *DNSServerCounter) exchangeOver(ctx context.Context, client *dns.Client, m *dns.Msg, server string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	r, _, err := client.ExchangeContext(ctx, m, server)
	return r, err
}

// owns reports whether rr is owned by name, which is lower case.
func owns(rr dns.RR, name string) bool {
	return strings.EqualFold(rr.Header().Name, name)
}
