package servercounter_test

import (
	"net"
	"testing"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/servercounter"
)

// rawUDPServer answers each UDP query with the bytes reply returns, for
// answers dnstest will not make (cut mid-record, per-type failures). With
// tcp set it also serves that handler over TCP on the same port. It returns
// the address.
func rawUDPServer(t testing.TB, reply func(q *dns.Msg) []byte, tcp dns.Handler) string {
	t.Helper()
	return rawUDPServerN(t, func(q *dns.Msg) [][]byte { return [][]byte{reply(q)} }, tcp)
}

// rawUDPServerN is rawUDPServer sending each query every packet replies
// returns, in order.
func rawUDPServerN(t testing.TB, replies func(q *dns.Msg) [][]byte, tcp dns.Handler) string {
	t.Helper()
	for try := 0; ; try++ {
		// TCP first, as dnstest does: a port free for TCP is the scarce
		// one on a machine with thousands of connections in TIME_WAIT.
		addr := "127.0.0.1:0"
		var tl net.Listener
		if tcp != nil {
			var err error
			tl, err = net.Listen("tcp", addr)
			require.NoError(t, err)
			addr = tl.Addr().String()
		}
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			require.NotNil(t, tl, "listen udp: %v", err)
			tl.Close()
			require.Less(t, try, 5, "no port free for TCP and UDP: %v", err)
			continue
		}
		addr = pc.LocalAddr().String()
		if tl != nil {
			srv := &dns.Server{Listener: tl, Handler: tcp}
			go srv.ActivateAndServe() //nolint:errcheck // ends with Shutdown
			t.Cleanup(func() { _ = srv.Shutdown() })
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4096)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				q := new(dns.Msg)
				if q.Unpack(buf[:n]) != nil {
					continue
				}
				for _, b := range replies(q) {
					if b != nil {
						_, _ = pc.WriteTo(b, from)
					}
				}
			}
		}()
		t.Cleanup(func() { pc.Close(); <-done })
		return addr
	}
}

func srvReply(q *dns.Msg, n int) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	for i := range n {
		r.Answer = append(r.Answer, &dns.SRV{
			Hdr:    dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 30},
			Port:   8091,
			Target: dns.Fqdn(net.IPv4(10, 0, 0, byte(i+1)).String() + ".pods.example"),
		})
	}
	return r
}

func rawCounter(t *testing.T, addr, name string, typ servercounter.RecordType) *servercounter.DNSServerCounter {
	t.Helper()
	c, err := servercounter.NewDNSServerCounter(servercounter.Config{
		Name: name, Type: typ, Servers: []string{addr}, ResolvConf: emptyResolvConf(t),
		// Every query is answered, or refused over TCP: the timeout only
		// bounds a loaded machine's delays, and 300 ms ran out under a
		// load of 16 on two cores.
		Timeout: waitFor, Attempts: 1,
	})
	require.NoError(t, err)
	return c
}

func TestDNSCountTruncatedReplyCutMidRecordRetriesOverTCP(t *testing.T) {
	t.Parallel()
	addr := rawUDPServer(t, func(q *dns.Msg) []byte {
		r := srvReply(q, 5)
		r.Truncated = true
		b, err := r.Pack()
		if err != nil {
			return nil
		}
		return b[:len(b)-7] // cut inside the last record
	}, dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { _ = w.WriteMsg(srvReply(q, 5)) }))
	res, err := rawCounter(t, addr, "_a._tcp.svc.example.", servercounter.TypeSRV).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 5, res.Count)
	assert.Equal(t, servercounter.TransportUDPThenTCP, res.Transport)
	assert.False(t, res.Truncated)
}

func TestDNSCountKeepsTruncatedUDPAnswerWhenTCPFails(t *testing.T) {
	t.Parallel()
	// No TCP listener: the port refuses TCP.
	addr := rawUDPServer(t, func(q *dns.Msg) []byte {
		r := srvReply(q, 2)
		r.Truncated = true
		b, _ := r.Pack()
		return b
	}, nil)
	res, err := rawCounter(t, addr, "_a._tcp.svc.example.", servercounter.TypeSRV).Count(t.Context())
	require.NoError(t, err, "a truncated answer is a lower bound, not an error")
	assert.Equal(t, 2, res.Count)
	assert.True(t, res.Truncated)
	assert.Equal(t, servercounter.TransportUDP, res.Transport)
}

func TestDNSCountIPToleratesOneFailingFamily(t *testing.T) {
	t.Parallel()
	const name = "svc.example."
	failing := func(failType uint16, rcode int) func(q *dns.Msg) []byte {
		return func(q *dns.Msg) []byte {
			r := new(dns.Msg)
			r.SetReply(q)
			switch q.Question[0].Qtype {
			case failType:
				r.Rcode = rcode
			case dns.TypeA:
				for i := range 3 {
					r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(10, 0, 0, byte(i+1))})
				}
			}
			b, _ := r.Pack()
			return b
		}
	}
	res, err := rawCounter(t, rawUDPServer(t, failing(dns.TypeAAAA, dns.RcodeServerFailure), nil), name, servercounter.TypeIP).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, res.Count)
	assert.True(t, res.Partial)

	// The failing family is the only one that could have records: unknown.
	_, err = rawCounter(t, rawUDPServer(t, failing(dns.TypeA, dns.RcodeRefused), nil), name, servercounter.TypeIP).Count(t.Context())
	var de *servercounter.DNSError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, servercounter.ErrorRefused, de.Kind)
}

func TestDNSCountIgnoresRecordsForOtherNamesAndClasses(t *testing.T) {
	t.Parallel()
	const name = "svc.example."
	addr := rawUDPServer(t, func(q *dns.Msg) []byte {
		r := new(dns.Msg)
		r.SetReply(q)
		a := func(owner string, class uint16, last byte) dns.RR {
			return &dns.A{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: class, Ttl: 30}, A: net.IPv4(10, 0, 0, last)}
		}
		if q.Question[0].Qtype == dns.TypeA {
			r.Answer = []dns.RR{a(name, dns.ClassINET, 1), a("other.example.", dns.ClassINET, 2), a(name, dns.ClassCHAOS, 3)}
		}
		b, _ := r.Pack()
		return b
	}, nil)
	res, err := rawCounter(t, addr, name, servercounter.TypeA).Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, res.Count)
}
