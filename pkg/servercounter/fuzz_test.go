package servercounter_test

import (
	"encoding/binary"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/servercount/servercount/pkg/servercounter"
)

// FuzzDNSCountAnswer sends a count whatever reply bytes the fuzzer makes,
// over a real UDP socket, with the query's ID patched in so that the reply
// is read and not dropped as a stray. The count must not panic, and never
// count more servers than the reply holds records.
func FuzzDNSCountAnswer(f *testing.F) {
	for _, seed := range []struct {
		typ  servercounter.RecordType
		name string
		n    int
	}{
		{servercounter.TypeA, "s.example.", 3},
		{servercounter.TypeIP, "s.example.", 2},
		{servercounter.TypeSRV, "_a._tcp.s.example.", 2},
		{servercounter.TypeA, "s.example.", 0},
	} {
		q := new(dns.Msg)
		q.SetQuestion(seed.name, seed.typ.DNSTypes()[0])
		var r *dns.Msg
		if seed.typ == servercounter.TypeSRV {
			r = srvReply(q, seed.n)
		} else {
			r = new(dns.Msg)
			r.SetReply(q)
			for i := range seed.n {
				r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: seed.name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(10, 0, 0, byte(i+1))})
			}
		}
		b, err := r.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(seed.typ), b)
	}

	// Under go test the inputs run in parallel, each on a server of its
	// own from servers, which holds as many as run at once (-parallel
	// defaults to GOMAXPROCS; more only wait their turn). Fuzzing runs
	// one input at a time, on one server, as it always did.
	servers := make(chan *fuzzServer, runtime.GOMAXPROCS(0))
	for range cap(servers) {
		servers <- newFuzzServer(f)
	}
	resolvConf := emptyResolvConf(f)
	f.Fuzz(func(t *testing.T, typ uint8, data []byte) {
		t.Parallel()
		srv := <-servers
		defer func() { servers <- srv }()
		rt := servercounter.RecordType(typ % 5)
		name := "s.example."
		if rt == servercounter.TypeSRV {
			name = "_a._tcp.s.example."
		}
		srv.reply.Store(&data)
		// The REFUSED after each reply ends a try the fuzzed reply did
		// not; the timeout is only a bound for a loaded machine.
		c, err := servercounter.NewDNSServerCounter(servercounter.Config{
			Name: name, Type: rt, Servers: []string{srv.addr}, ResolvConf: resolvConf,
			Timeout: 10 * time.Second, Attempts: 1, Max: 100,
		})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Count(t.Context())
		if err != nil {
			return
		}
		sent := 0
		if m := new(dns.Msg); m.Unpack(data) == nil {
			sent = len(m.Answer)
		}
		if res.Found > sent {
			t.Fatalf("counted %d servers from a reply of %d records", res.Found, sent)
		}
		if res.Count > 100 {
			t.Fatalf("count %d above Max 100", res.Count)
		}
	})
}

// fuzzServer answers each query with the reply an input stored, its ID
// patched in so that the reply is read and not dropped as a stray.
type fuzzServer struct {
	addr  string
	reply atomic.Pointer[[]byte]
}

func newFuzzServer(f *testing.F) *fuzzServer {
	s := new(fuzzServer)
	// Each query gets the fuzzed reply, then a well-formed REFUSED: a
	// reply the client drops as not its own (another question, bytes
	// that do not parse) is followed by one it takes, so that an input
	// costs one exchange, not a timeout.
	s.addr = rawUDPServerN(f, func(q *dns.Msg) [][]byte {
		refused, err := new(dns.Msg).SetRcode(q, dns.RcodeRefused).Pack()
		if err != nil {
			return nil
		}
		p := s.reply.Load()
		if p == nil || len(*p) < 2 {
			return [][]byte{refused}
		}
		b := append([]byte(nil), *p...)
		binary.BigEndian.PutUint16(b, q.Id)
		return [][]byte{b, refused}
	}, nil)
	return s
}
