package dnstest

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// FaultKind is a way the server misbehaves.
type FaultKind int

const (
	// FaultNone answers normally.
	FaultNone FaultKind = iota
	// FaultServFail answers SERVFAIL, as a server that cannot reach its
	// data does.
	FaultServFail
	// FaultRefused answers REFUSED, as a server that will not serve the
	// client does.
	FaultRefused
	// FaultDrop reads the query and sends nothing, so the client times
	// out.
	FaultDrop
	// FaultSlow waits [Fault.Delay], or until the server is closed, and
	// then answers normally.
	FaultSlow
	// FaultTruncate answers with the TC bit set and only the first half
	// (rounded down) of the answer records, as a UDP server whose reply
	// does not fit does (RFC 2181 section 9).
	FaultTruncate
	// FaultWrongID answers normally but with a different message ID, as a
	// late reply to an earlier query or a spoofed one looks.
	FaultWrongID
	// FaultWrongQuestion answers normally but with a question section for
	// the name "wrong.example." (or "other.wrong.example." if that was
	// asked), which a client must reject (RFC 5452).
	FaultWrongQuestion
	// FaultGarbage writes bytes that do not unpack as a DNS message: a
	// header that echoes the query's ID and announces one question,
	// followed by a label that runs past the end. Over TCP the bytes get
	// the usual two-byte length prefix.
	FaultGarbage
	// FaultHold holds each answer until [Server.Release] lets it go,
	// oldest first, or the server is closed; then it answers normally.
	// A test decides the order in which held queries are answered.
	FaultHold
)

// String returns the name of the constant, e.g. "FaultServFail".
func (k FaultKind) String() string {
	switch k {
	case FaultNone:
		return "FaultNone"
	case FaultServFail:
		return "FaultServFail"
	case FaultRefused:
		return "FaultRefused"
	case FaultDrop:
		return "FaultDrop"
	case FaultSlow:
		return "FaultSlow"
	case FaultTruncate:
		return "FaultTruncate"
	case FaultWrongID:
		return "FaultWrongID"
	case FaultWrongQuestion:
		return "FaultWrongQuestion"
	case FaultGarbage:
		return "FaultGarbage"
	case FaultHold:
		return "FaultHold"
	default:
		return fmt.Sprintf("FaultKind(%d)", int(k))
	}
}

// Fault describes how the server misbehaves. The zero value is no fault.
type Fault struct {
	// Kind is what the server does wrong.
	Kind FaultKind
	// Network limits the fault to queries over "udp" or "tcp". Empty
	// affects both; any other value affects none.
	Network string
	// Count limits the fault to the next Count matching queries, after
	// which the server behaves until the next SetFault. Zero or less
	// means until the fault is cleared.
	Count int
	// Delay is how long FaultSlow holds each answer back.
	Delay time.Duration
}

// SetFault makes the server misbehave as f describes, starting with the next
// query. It replaces the previous fault, and restarts [Fault.Count].
func (s *Server) SetFault(f Fault) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.fault = f
	s.faultLeft = f.Count
}

// hold queues a held answer and returns the channel that Release closes.
func (s *Server) hold() chan struct{} {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	c := make(chan struct{})
	s.held = append(s.held, c)
	return c
}

// Held reports how many answers [FaultHold] is holding.
func (s *Server) Held() int {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return len(s.held)
}

// Release lets the oldest answer held by [FaultHold] go, and reports
// whether there was one.
func (s *Server) Release() bool {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	if len(s.held) == 0 {
		return false
	}
	close(s.held[0])
	s.held = s.held[1:]
	return true
}

// ClearFault makes the server behave again.
func (s *Server) ClearFault() {
	s.SetFault(Fault{})
}

// takeFault returns the fault to apply to a query that arrived over network,
// using up one of [Fault.Count]. It returns the zero Fault when the query is
// to be answered normally.
func (s *Server) takeFault(network string) Fault {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f := s.fault
	if f.Kind == FaultNone || (f.Network != "" && f.Network != network) {
		return Fault{}
	}
	if f.Count > 0 {
		if s.faultLeft == 0 {
			return Fault{}
		}
		s.faultLeft--
	}
	return f
}

// applyFault changes the normal reply m as f requires. Faults that replace
// the reply altogether (drop, slow, garbage) are handled before m is built.
func applyFault(m *dns.Msg, f Fault) {
	switch f.Kind {
	case FaultServFail, FaultRefused:
		rcode := dns.RcodeServerFailure
		if f.Kind == FaultRefused {
			rcode = dns.RcodeRefused
		}
		m.Rcode = rcode
		m.Authoritative = false
		m.Answer, m.Ns = nil, nil
		m.Extra = keepOPT(m.Extra)
	case FaultTruncate:
		m.Truncated = true
		m.Answer = m.Answer[:len(m.Answer)/2]
	case FaultWrongID:
		m.Id++
	case FaultWrongQuestion:
		for i := range m.Question {
			wrong := "wrong.example."
			if strings.EqualFold(m.Question[i].Name, wrong) {
				wrong = "other.wrong.example."
			}
			m.Question[i].Name = wrong
		}
	}
}

// keepOPT returns the OPT record of extra, if any, dropping everything else.
func keepOPT(extra []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

// garbage returns bytes that do not unpack as a DNS message. They are
// deterministic, so a failing test can be replayed, and start with a valid
// header echoing id, so the client gets as far as unpacking the body instead
// of discarding the reply by its ID.
func garbage(id uint16) []byte {
	b := make([]byte, 12, 16)
	binary.BigEndian.PutUint16(b[0:], id)
	binary.BigEndian.PutUint16(b[2:], 1<<15) // QR: a response
	binary.BigEndian.PutUint16(b[4:], 1)     // QDCOUNT
	// The question's first label claims 63 bytes, but only 3 follow.
	return append(b, 63, 0xde, 0xad, 0xbe)
}
