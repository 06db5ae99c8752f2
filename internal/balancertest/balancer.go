// Package balancertest is a TCP load balancer on loopback for tests,
// benchmarks and the demo: it stands where a Kubernetes Service or a cloud
// load balancer stands in front of proxy-servers.
//
// It imports nothing of this module, so that any package's in-package
// tests can use it, those of pkg/agent included, which internal/proxytest
// (it imports pkg/agent) cannot serve.
package balancertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

// Balancer sends each new connection to a random backend and relays bytes
// both ways until either side ends.
type Balancer struct {
	l net.Listener
	// ctx is cancelled by Close, to abort the dials of relays in progress.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex // guards the fields below
	backends []string
	conns    map[net.Conn]struct{}
	// frozen holds, by backend, a channel closed by Freeze: the relays to
	// that backend stop forwarding.
	frozen map[string]chan struct{}
	closed bool

	wg sync.WaitGroup // every goroutine the balancer started
}

// New listens on a random port of 127.0.0.1 and balances over backends
// (host:port addresses). With none, it accepts connections and closes them
// at once, as a Service without endpoints does.
func New(backends ...string) (*Balancer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("balancer: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lb := &Balancer{
		l: l, ctx: ctx, cancel: cancel,
		backends: append([]string(nil), backends...),
		conns:    map[net.Conn]struct{}{},
		frozen:   map[string]chan struct{}{},
	}
	lb.wg.Go(lb.serve)
	return lb, nil
}

// Addr is the balancer's host:port.
func (lb *Balancer) Addr() string { return lb.l.Addr().String() }

// SetBackends replaces the backends; open connections stay where they are.
func (lb *Balancer) SetBackends(backends ...string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.backends = append([]string(nil), backends...)
}

// Cut cuts every relayed connection and goes on accepting new ones, as a
// load balancer that restarts or fails over does: the clients must
// connect again.
func (lb *Balancer) Cut() {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for c := range lb.conns {
		_ = c.Close()
	}
}

// Freeze makes every relay to backend, open or to come, stop forwarding
// in both directions, its sockets left open: a load balancer or proxy
// whose process froze, or a path that drops everything while both ends'
// kernels still hold their connections. Nothing is closed and nothing
// reset; what either end sends is read by the relay and goes no further.
// Only Close ends the relays.
func (lb *Balancer) Freeze(backend string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	close(lb.frozenLocked(backend))
}

// frozenLocked returns backend's freeze channel. Called with mu held.
func (lb *Balancer) frozenLocked(backend string) chan struct{} {
	ch := lb.frozen[backend]
	if ch == nil {
		ch = make(chan struct{})
		lb.frozen[backend] = ch
	}
	return ch
}

// Close stops accepting, cuts every relayed connection, aborts the dials
// in progress and waits for every relay to end. The error is the
// listener's.
func (lb *Balancer) Close() error {
	err := lb.l.Close()
	lb.cancel()
	lb.mu.Lock()
	lb.closed = true
	for c := range lb.conns {
		_ = c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
	return err
}

func (lb *Balancer) serve() {
	for {
		c, err := lb.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		lb.mu.Lock()
		var backend string
		if n := len(lb.backends); n > 0 {
			backend = lb.backends[rand.IntN(n)]
		}
		lb.mu.Unlock()
		lb.wg.Go(func() { lb.relay(c, backend) })
	}
}

func (lb *Balancer) relay(c net.Conn, backend string) {
	defer c.Close()
	if backend == "" {
		return
	}
	var d net.Dialer
	b, err := d.DialContext(lb.ctx, "tcp", backend)
	if err != nil {
		return
	}
	defer b.Close()
	if !lb.track(c, b) {
		return
	}
	defer lb.untrack(c, b)
	lb.mu.Lock()
	frozen := lb.frozenLocked(backend)
	lb.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		// Through a buffer, not io.Copy's splice(2): Linux's splice holds a
		// pipe (two files) per direction of every relayed connection,
		// which a balancer outside the process does not cost, and which
		// would double the open files of a fleet behind this one.
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-frozen:
				// Frozen: forward nothing more, not even an end.
				<-lb.ctx.Done()
				done <- struct{}{}
				return
			default:
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Half-close so that the other direction can finish, then end both.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done
	_ = c.Close()
	_ = b.Close()
	<-done
}

// track records the connections of a relay for Close to cut, and reports
// false if the balancer is already closed.
func (lb *Balancer) track(cs ...net.Conn) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return false
	}
	for _, c := range cs {
		lb.conns[c] = struct{}{}
	}
	return true
}

func (lb *Balancer) untrack(cs ...net.Conn) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, c := range cs {
		delete(lb.conns, c)
	}
}
