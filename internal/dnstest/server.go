package dnstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// bindAttempts is how many random ports Start tries. Binding TCP to port 0
// picks a port that is free for TCP only, so UDP's bind on the same number can
// fail when another process holds it; a fresh port almost always works.
//
// TCP goes first because its ports are the scarce ones: a machine that makes
// many TCP connections keeps thousands of client ports in TIME_WAIT, and a
// listener cannot bind those, while few UDP ports are ever taken. Binding UDP
// first made every try fail when other tests on the machine had used up most
// of the ephemeral range.
const bindAttempts = 10

// Server is a DNS server on 127.0.0.1 serving UDP and TCP on the same port.
//
// Create one with [Start] or [NewServer]. It starts with no records, so every
// query is answered NXDOMAIN until [Server.SetZone] or [Server.SetRecords] is
// called. A Server is safe for concurrent use.
type Server struct {
	addr string

	// udp and tcp are set by Start and only read afterwards.
	udp, tcp *transport

	// closing is closed when Close starts, so handlers delayed by a fault
	// return at once instead of holding up the shutdown.
	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error // written once inside closeOnce

	// mu guards data. The snapshot it points to is never modified, so a
	// handler may keep using it after releasing mu.
	mu   sync.RWMutex
	data *records

	// faultMu guards fault, faultLeft and held.
	faultMu   sync.Mutex
	fault     Fault
	faultLeft int             // queries still to affect when fault.Count > 0
	held      []chan struct{} // answers FaultHold holds, oldest first

	udpQueries atomic.Int64
	tcpQueries atomic.Int64

	// observer, when set, is called for every query as it arrives; see
	// ObserveQueries.
	observer atomic.Pointer[func(network string)]
}

// transport is one of the two miekg servers behind a Server.
type transport struct {
	network string
	srv     *dns.Server
	// served receives ActivateAndServe's result exactly once.
	served chan error
}

// Start starts a server on 127.0.0.1, on a random port shared by UDP and TCP.
//
// It returns once both listeners are serving, so a query sent right after
// Start returns is answered. Call [Server.Close] to stop it.
func Start() (*Server, error) {
	var (
		pc  net.PacketConn
		l   net.Listener
		err error
	)
	for range bindAttempts {
		pc, l, err = listen()
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("dnstest: start server after %d attempts: %w", bindAttempts, err)
	}

	s := &Server{
		addr:    pc.LocalAddr().String(),
		closing: make(chan struct{}),
		data:    newRecords(nil),
	}
	s.udp = s.newTransport("udp", &dns.Server{PacketConn: pc})
	// miekg closes a TCP connection after 128 queries by default; clients
	// that reuse one connection, as benchmarks do, must not see that.
	s.tcp = s.newTransport("tcp", &dns.Server{Listener: l, MaxTCPQueries: -1})

	udpErr := s.udp.start()
	tcpErr := s.tcp.start()
	if err := errors.Join(udpErr, tcpErr); err != nil {
		// Stop whichever transport did start, so no goroutine outlives the
		// failed Start.
		s.closeOnce.Do(func() {
			close(s.closing)
			// Errors from stopping matter less than why Start failed.
			if udpErr == nil {
				_ = s.udp.stop()
			} else {
				_ = pc.Close()
			}
			if tcpErr == nil {
				_ = s.tcp.stop()
			} else {
				_ = l.Close()
			}
		})
		return nil, fmt.Errorf("dnstest: start server on %s: %w", s.addr, err)
	}
	return s, nil
}

// listen binds TCP on a random port of 127.0.0.1 and then UDP on the same
// port.
func listen() (net.PacketConn, net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("listen tcp: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("listen udp on the tcp port %d: %w", port, err)
	}
	return pc, l, nil
}

// NewServer is [Start] for tests: it fails the test if the server cannot
// start, and registers [Server.Close] with t.Cleanup.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// newTransport wires srv to s. Each transport gets its own handler and
// accept function, so the network is known without inspecting addresses, and
// the global dns.DefaultServeMux is never touched.
func (s *Server) newTransport(network string, srv *dns.Server) *transport {
	srv.Net = network
	srv.Handler = dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		s.serveDNS(w, req, network)
	})
	// Counting in the accept function counts every query that arrived,
	// including malformed ones the handler never sees.
	counter := &s.udpQueries
	if network == "tcp" {
		counter = &s.tcpQueries
	}
	srv.MsgAcceptFunc = func(dh dns.Header) dns.MsgAcceptAction {
		counter.Add(1)
		if f := s.observer.Load(); f != nil {
			(*f)(network)
		}
		return dns.DefaultMsgAcceptFunc(dh)
	}
	return &transport{network: network, srv: srv, served: make(chan error, 1)}
}

// start serves t in a new goroutine and waits until it is serving or has
// failed to start.
func (t *transport) start() error {
	started := make(chan struct{})
	t.srv.NotifyStartedFunc = func() { close(started) }
	go func() { t.served <- t.srv.ActivateAndServe() }()
	select {
	case <-started:
		return nil
	case err := <-t.served:
		return fmt.Errorf("serve %s: %w", t.network, err)
	}
}

// stop shuts t down and waits until its serving goroutine, and every handler
// it started, has returned.
func (t *transport) stop() error {
	// No deadline: handlers never block once Server.closing is closed, so
	// shutdown finishes as soon as in-flight writes do.
	shutdownErr := t.srv.ShutdownContext(context.Background())
	if shutdownErr != nil {
		shutdownErr = fmt.Errorf("shut down %s: %w", t.network, shutdownErr)
	}
	serveErr := <-t.served
	if serveErr != nil {
		serveErr = fmt.Errorf("serve %s: %w", t.network, serveErr)
	}
	return errors.Join(shutdownErr, serveErr)
}

// Addr returns the address the server listens on, "127.0.0.1:PORT", for both
// UDP and TCP.
func (s *Server) Addr() string { return s.addr }

// Close shuts down both listeners and waits for in-flight queries to be
// handled. Queries held back by [FaultSlow] or [FaultHold] are answered at
// once, so Close never waits for the rest of a fault's Delay.
//
// Close may be called more than once; later calls return the first call's
// result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		err := errors.Join(s.udp.stop(), s.tcp.stop())
		if err != nil {
			s.closeErr = fmt.Errorf("dnstest: close server on %s: %w", s.addr, err)
		}
	})
	return s.closeErr
}

// Queries reports how many queries arrived over network: "udp", "tcp", or ""
// for both. Every message with a readable header counts, whether it was
// answered, rejected as malformed or affected by a fault. Any other network
// reports 0.
func (s *Server) Queries(network string) int {
	switch network {
	case "udp":
		return int(s.udpQueries.Load())
	case "tcp":
		return int(s.tcpQueries.Load())
	case "":
		return int(s.udpQueries.Load() + s.tcpQueries.Load())
	default:
		return 0
	}
}

// ObserveQueries calls f for every query as it arrives, with its network
// ("udp" or "tcp"), counted as [Server.Queries] counts them: a benchmark
// records when queries come, to find bursts. f runs in the server's
// goroutine before the query is handled, so it must return quickly. A nil
// f stops the calls.
func (s *Server) ObserveQueries(f func(network string)) {
	if f == nil {
		s.observer.Store(nil)
		return
	}
	s.observer.Store(&f)
}

// SetZone replaces all records with those parsed from text, in the zone file
// format of RFC 1035 section 5.
//
// Relative names are relative to the root, and records without a TTL get a
// TTL of 30 seconds. $INCLUDE is not allowed. On a parse error SetZone
// returns an error naming the line and keeps the current records.
func (s *Server) SetZone(text string) error {
	rrs, err := ParseZone(text)
	if err != nil {
		return err
	}
	s.SetRecords(rrs...)
	return nil
}

// MustSetZone is [Server.SetZone] for tests: it fails the test on a parse
// error.
func (s *Server) MustSetZone(t testing.TB, text string) {
	t.Helper()
	if err := s.SetZone(text); err != nil {
		t.Fatal(err)
	}
}

// SetRecords replaces all records with rrs. The server keeps copies, so the
// caller may change rrs afterwards.
func (s *Server) SetRecords(rrs ...dns.RR) {
	data := newRecords(rrs)
	s.mu.Lock()
	s.data = data
	s.mu.Unlock()
}

// snapshot returns the current records.
func (s *Server) snapshot() *records {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.data
}

// serveDNS answers req, which arrived over network, applying the current
// fault.
func (s *Server) serveDNS(w dns.ResponseWriter, req *dns.Msg, network string) {
	f := s.takeFault(network)

	switch f.Kind {
	case FaultDrop:
		return
	case FaultSlow:
		timer := time.NewTimer(f.Delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-s.closing:
			// Answer now rather than hold up Close for the rest of the
			// delay. The connection is still open: miekg closes it only
			// after every handler has returned.
		}
	case FaultHold:
		select {
		case <-s.hold():
		case <-s.closing:
		}
	case FaultGarbage:
		// Write, not WriteMsg: the bytes must reach the client as they are
		// (miekg adds only the TCP length prefix).
		_, _ = w.Write(garbage(req.Id))
		return
	}

	m := s.answer(req)
	applyFault(m, f)

	// RFC 1035 section 4.2.1 limits UDP replies to 512 bytes unless the
	// client advertised a larger buffer with EDNS0 (RFC 6891 section 6.2.5).
	size := dns.MaxMsgSize
	if network == "udp" {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
	}
	m.Truncate(size)

	// A write error means the client has gone; there is nobody to tell.
	_ = w.WriteMsg(m)
}

// answer builds the reply to req from the current records, echoing the
// client's EDNS0 OPT record if it sent one.
func (s *Server) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	if len(req.Question) != 1 {
		// The default accept function already rejects these; this only
		// keeps answer safe on its own.
		m.SetRcodeFormatError(req)
	} else {
		s.snapshot().answer(m, req)
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), opt.Do())
	}
	return m
}
