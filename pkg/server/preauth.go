package server

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/servercount/servercount/pkg/clock"
)

// MaxPreAuthBytes bounds what the server reads from an agent connection
// before one of its streams has been admitted: the TLS handshake, HTTP/2's
// preface and settings, and the headers of the streams in handshake. An
// agent's come to about 10 KiB (a certificate chain, a service-account
// token); an agent sends no packet before its handshake is answered, ours
// and upstream's. A connection that sends more before it has proven
// anything is closed: each stream whose token is in review could
// otherwise hold a stream window (1 MiB) of data the handler has not
// read, and a stream refused could be replaced by one that brings another.
const MaxPreAuthBytes = 64 << 10

// errPreAuthBytes ends a connection that sent more than MaxPreAuthBytes
// before any of its streams was admitted.
var errPreAuthBytes = errors.New("agent connection sent too much before it authenticated")

// AgentListener returns l with the agent port's pre-authentication
// bounds: the server reads at most [MaxPreAuthBytes] from each connection
// until one of its streams is admitted, and closes a connection that
// sends more. An address that had a connection closed so in the last 10
// seconds has its handshakes refused without a check, and one whose
// connections were closed so more than refusedBurst times, past one a
// second, has its new connections closed at once, before their TLS
// handshake, until it is back within that bound (with
// Config.MaxHandshakesPerAddress negative, addresses are not told
// apart: neither applies). Serve the agent gRPC server on it.
func (s *Server) AgentListener(l net.Listener) net.Listener {
	return &preAuthListener{Listener: l, conns: &s.admission.preAuth}
}

// preAuthConns holds the agent connections not yet admitted, by remote
// address, for the handshake to open, and what is left of each address's
// bucket of connections closed for what they sent before they
// authenticated (refusedBurst, refilled at refusedPerSecond, as refused
// tokens are counted).
type preAuthConns struct {
	m      *metrics    // set by New
	byAddr bool        // whether addresses are told apart; set by New
	clock  clock.Clock // the buckets' time; set by New
	mu     sync.Mutex
	conns  map[string]*preAuthConn        // guarded by mu
	cut    map[netip.Prefix]*rate.Limiter // guarded by mu
}

// strike spends one of addr's bucket, which starts full at its first
// cut. When maxRefusingAddrs are counted, one of them, chosen by the
// map's order, is forgotten for a new one.
func (p *preAuthConns) strike(addr netip.Prefix) {
	if !p.byAddr {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	lim := p.cut[addr]
	if lim == nil {
		if p.cut == nil {
			p.cut = map[netip.Prefix]*rate.Limiter{}
		}
		if len(p.cut) >= maxRefusingAddrs {
			for a := range p.cut {
				delete(p.cut, a)
				break
			}
		}
		lim = rate.NewLimiter(refusedPerSecond, refusedBurst)
		p.cut[addr] = lim
	}
	lim.AllowN(p.clock.Now(), 1) // takes one if there is one; the bucket stays empty else
}

// refusing reports whether addr's bucket is empty: its connections are
// closed at accept.
func (p *preAuthConns) refusing(addr netip.Prefix) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lim := p.cut[addr]
	return lim != nil && lim.TokensAt(p.clock.Now()) < 1
}

// suspect reports whether addr had a connection cut of late, its bucket
// not yet full again (within refusedBurst / refusedPerSecond of the
// last): its handshakes are refused without a check. An agent never
// sends what gets a connection cut, and an address that did must not
// spend the reviews that every agent shares while it is still at it.
func (p *preAuthConns) suspect(addr netip.Prefix) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	lim := p.cut[addr]
	return lim != nil && lim.TokensAt(p.clock.Now()) < refusedBurst
}

// open lifts the bound of the connection from remote, if it has one.
func (p *preAuthConns) open(remote string) {
	p.mu.Lock()
	c := p.conns[remote]
	delete(p.conns, remote)
	p.mu.Unlock()
	if c != nil && !c.opened.Swap(true) {
		p.m.addPreAuthConns(-1)
	}
}

func (p *preAuthConns) add(c *preAuthConn) {
	p.mu.Lock()
	if p.conns == nil {
		p.conns = map[string]*preAuthConn{}
	}
	p.conns[c.RemoteAddr().String()] = c
	p.mu.Unlock()
	p.m.addPreAuthConns(1)
}

// remove forgets c, closed.
func (p *preAuthConns) remove(c *preAuthConn) {
	p.mu.Lock()
	if p.conns[c.RemoteAddr().String()] == c {
		delete(p.conns, c.RemoteAddr().String())
	}
	p.mu.Unlock()
	if !c.opened.Swap(true) {
		p.m.addPreAuthConns(-1)
	}
}

type preAuthListener struct {
	net.Listener
	conns *preAuthConns
}

func (l *preAuthListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := addrPrefix(c.RemoteAddr())
		if l.conns.refusing(addr) {
			// Closed before gRPC sees it: no TLS handshake, no read.
			l.conns.m.observeAgentRejection(rejectTooManyCut)
			_ = c.Close()
			continue
		}
		pc := &preAuthConn{Conn: c, conns: l.conns, addr: addr}
		l.conns.add(pc)
		return pc, nil
	}
}

// preAuthConn is an agent connection that reads at most MaxPreAuthBytes
// until opened is set.
type preAuthConn struct {
	net.Conn
	conns *preAuthConns
	addr  netip.Prefix // of the remote address, as the handshake bounds count it
	// opened is set once a stream of the connection was admitted, or the
	// connection closed; read counts the bytes read until then (one more
	// once the bound was passed and counted). Only gRPC's reader
	// goroutine reads.
	opened    atomic.Bool
	read      int
	closeOnce sync.Once
}

func (c *preAuthConn) Read(b []byte) (int, error) {
	if c.opened.Load() {
		return c.Conn.Read(b)
	}
	left := MaxPreAuthBytes - c.read
	if left <= 0 {
		if c.read == MaxPreAuthBytes {
			c.read++ // counted once
			c.conns.m.observeAgentRejection(rejectTooManyBytes)
			c.conns.strike(c.addr)
		}
		return 0, errPreAuthBytes
	}
	if len(b) > left {
		b = b[:left]
	}
	n, err := c.Conn.Read(b)
	c.read += n
	return n, err
}

func (c *preAuthConn) Close() error {
	c.closeOnce.Do(func() { c.conns.remove(c) })
	return c.Conn.Close()
}
