package servercounter

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// answer is what one name and type resolved to on one server, CNAMEs
// followed, or why it failed.
type answer struct {
	outcome   Outcome
	rrs       []dns.RR // records of the type asked for, at the end of the chain
	extra     []dns.RR // glue for SRV targets
	ttl       uint32
	rcode     int
	truncated bool
	transport Transport
	err       error // a *failure: this type's answer is unknown
}

// query asks server for each of qtypes at name, at once, and returns one
// answer per type; the error is for the exchange as a whole. When an answer
// ends in a CNAME whose target the server did not answer for, as an
// authoritative server outside the target's zone does, query asks again
// for the target, up to maxCNAMEs in all.
func (c *DNSServerCounter) query(ctx context.Context, server, name string, qtypes []uint16, hops int) ([]answer, error) {
	replies, transport, err := c.exchange(ctx, server, name, qtypes)
	if err != nil {
		return nil, err
	}
	answers := make([]answer, len(qtypes))
	for i, qtype := range qtypes {
		a, target, n, err := classify(dns.Question{Name: name, Qtype: qtype, Qclass: dns.ClassINET}, replies[i])
		a.transport = transport[i]
		switch {
		case err != nil:
			a.err = err
		case a.outcome == OutcomeNoData && target != name && hops+n >= maxCNAMEs:
			a.err = errCNAMELoop
		case a.outcome == OutcomeNoData && target != name:
			more, err := c.query(ctx, server, target, qtypes[i:i+1], hops+n)
			if err != nil {
				return nil, err
			}
			a = more[0]
		}
		answers[i] = a
	}
	return answers, nil
}

// exchange sends one query per type and returns the replies in order, with
// how each arrived. Over UDP the queries share one socket, as glibc's
// resolver sends A and AAAA together; a truncated reply is asked again over
// TCP (RFC 7766). The returned error is a *failure.
func (c *DNSServerCounter) exchange(ctx context.Context, server, name string, qtypes []uint16) ([]*dns.Msg, []Transport, error) {
	msgs := make([]*dns.Msg, len(qtypes))
	for i, t := range qtypes {
		m := new(dns.Msg)
		m.SetQuestion(name, t)
		m.SetEdns0(c.cfg.UDPSize, false)
		if i > 0 {
			// Replies are matched to queries by ID.
			m.Id = msgs[i-1].Id + 1
		}
		msgs[i] = m
	}
	transports := make([]Transport, len(msgs))
	if c.cfg.TCP {
		for i := range transports {
			transports[i] = TransportTCP
		}
		replies, err := c.exchangeTCP(ctx, server, msgs)
		return replies, transports, err
	}
	replies, err := c.exchangeUDP(ctx, server, msgs)
	if err != nil {
		return nil, nil, err
	}
	var retry []*dns.Msg
	for i, r := range replies {
		transports[i] = TransportUDP
		if r.Truncated {
			transports[i] = TransportUDPThenTCP
			msgs[i].Id = dns.Id()
			retry = append(retry, msgs[i])
		}
	}
	if len(retry) == 0 {
		return replies, transports, nil
	}
	again, err := c.exchangeTCP(ctx, server, retry)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, err
		}
		// TCP is refused or blocked: the truncated UDP answers still count,
		// as lower bounds, rather than losing what they hold.
		for i := range transports {
			if transports[i] == TransportUDPThenTCP {
				transports[i] = TransportUDP
			}
		}
		return replies, transports, nil
	}
	for i := range replies {
		if transports[i] == TransportUDPThenTCP {
			replies[i], again = again[0], again[1:]
		}
	}
	return replies, transports, nil
}

// exchangeUDP writes msgs on one connected UDP socket and reads until each
// has its reply. Datagrams whose ID matches no query are dropped: they are
// late replies or spoofs. A reply with a matching ID that does not unpack
// fails the exchange as malformed.
func (c *DNSServerCounter) exchangeUDP(ctx context.Context, server string, msgs []*dns.Msg) ([]*dns.Msg, error) {
	nc, err := dialUDP(ctx, server)
	if err != nil {
		return nil, exchangeFailure(err)
	}
	defer nc.Close()
	defer watch(ctx, nc)()

	co := &dns.Conn{Conn: nc, UDPSize: c.cfg.UDPSize}
	for _, m := range msgs {
		if err := co.WriteMsg(m); err != nil {
			return nil, exchangeFailure(ctxErr(ctx, err))
		}
	}
	replies := make([]*dns.Msg, len(msgs))
	for left := len(msgs); left > 0; {
		var h dns.Header
		p, err := co.ReadMsgHeader(&h)
		if err != nil {
			return nil, exchangeFailure(ctxErr(ctx, err))
		}
		i := -1
		for j, m := range msgs {
			if m.Id == h.Id && replies[j] == nil {
				i = j
			}
		}
		if i < 0 {
			continue
		}
		r := new(dns.Msg)
		if err := r.Unpack(p); err != nil {
			// A truncated reply may be cut mid-record: TCP will carry it
			// whole. Unpack has set the header before it failed.
			if !r.Truncated {
				return nil, &failure{kind: ErrorMalformed, rcode: -1, err: err}
			}
			r = &dns.Msg{MsgHdr: r.MsgHdr}
		} else if !asks(r, msgs[i]) {
			// Right ID, wrong question: a spoof or a stray; keep waiting
			// for the real reply (RFC 5452, section 9.1).
			continue
		}
		replies[i] = r
		left--
	}
	return replies, nil
}

// dialUDP connects a UDP socket to server. An IP address is used as it
// is, sparing the resolver's parse of it on every query.
func dialUDP(ctx context.Context, server string) (net.Conn, error) {
	if ap, err := netip.ParseAddrPort(server); err == nil {
		return net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
	}
	var d net.Dialer
	return d.DialContext(ctx, "udp", server)
}

// exchangeTCP sends msgs one after the other on one TCP connection.
func (c *DNSServerCounter) exchangeTCP(ctx context.Context, server string, msgs []*dns.Msg) ([]*dns.Msg, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", server)
	if err != nil {
		return nil, exchangeFailure(ctxErr(ctx, err))
	}
	defer nc.Close()
	defer watch(ctx, nc)()

	co := &dns.Conn{Conn: nc}
	replies := make([]*dns.Msg, len(msgs))
	for i, m := range msgs {
		if err := co.WriteMsg(m); err != nil {
			return nil, exchangeFailure(ctxErr(ctx, err))
		}
		r, err := co.ReadMsg()
		if err != nil {
			return nil, exchangeFailure(ctxErr(ctx, err))
		}
		if r.Id != m.Id {
			return nil, &failure{kind: ErrorMalformed, rcode: -1, err: dns.ErrId}
		}
		replies[i] = r
	}
	return replies, nil
}

// watch makes the end of ctx interrupt a blocked read or write on conn,
// and applies ctx's deadline to it, until unwatch is called.
func watch(ctx context.Context, conn net.Conn) (unwatch func()) {
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }
}

// errQueryTimeout is why a try that got no answer within Config.Timeout
// failed.
var errQueryTimeout = errors.New("no answer within the query timeout")

// ctxErr returns why ctx ended, when it did, since that says better than
// the I/O error why the exchange stopped.
func ctxErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return errors.Join(cause, err)
	}
	return err
}

// asks reports whether r's question is m's.
func asks(r, m *dns.Msg) bool {
	return len(r.Question) == 1 && strings.EqualFold(r.Question[0].Name, m.Question[0].Name) &&
		r.Question[0].Qtype == m.Question[0].Qtype && r.Question[0].Qclass == m.Question[0].Qclass
}

// owns reports whether rr is owned by name.
func owns(rr dns.RR, name string) bool {
	return strings.EqualFold(rr.Header().Name, name)
}
