// Package proxytest runs proxy-servers, proxy-agents, load balancers and
// HTTP targets in-process over loopback sockets, for integration tests,
// benchmarks and the demo.
package proxytest

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
)

// LoadBalancer is a TCP load balancer on 127.0.0.1 that sends each new
// connection to a random backend, as a Kubernetes Service or a cloud load
// balancer in front of proxy-servers does.
type LoadBalancer struct {
	l net.Listener

	mu       sync.Mutex // guards the fields below
	backends []string
	conns    map[net.Conn]struct{}
	closed   bool

	wg sync.WaitGroup // every goroutine the balancer started
}

// NewLoadBalancer listens on a random loopback port.
func NewLoadBalancer(backends ...string) (*LoadBalancer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	lb := &LoadBalancer{l: l, backends: backends, conns: map[net.Conn]struct{}{}}
	lb.wg.Add(1)
	go lb.serve()
	return lb, nil
}

// Addr is the balancer's address.
func (lb *LoadBalancer) Addr() string { return lb.l.Addr().String() }

// SetBackends replaces the backends; open connections stay where they are.
func (lb *LoadBalancer) SetBackends(backends ...string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.backends = append([]string(nil), backends...)
}

// Close stops accepting, cuts every relayed connection and waits for the
// relays to end.
func (lb *LoadBalancer) Close() error {
	err := lb.l.Close()
	lb.mu.Lock()
	lb.closed = true
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
	return err
}

func (lb *LoadBalancer) serve() {
	defer lb.wg.Done()
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
		lb.wg.Add(1)
		go lb.relay(c, backend)
	}
}

func (lb *LoadBalancer) relay(c net.Conn, backend string) {
	defer lb.wg.Done()
	defer c.Close()
	if backend == "" {
		return
	}
	b, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer b.Close()
	if !lb.track(c, b) {
		return
	}
	defer lb.untrack(c, b)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		// Through a buffer, not io.Copy's splice(2): Linux's splice holds a
		// pipe (two files) per direction of every relayed connection,
		// which a balancer outside the process does not cost, and which
		// would double the open files of a fleet behind this one.
		_, _ = io.CopyBuffer(writerOnly{dst}, src, make([]byte, 32<<10))
		// Half-close so that the other direction can finish, then end both.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done
	c.Close()
	b.Close()
	<-done
}

func (lb *LoadBalancer) track(cs ...net.Conn) bool {
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

func (lb *LoadBalancer) untrack(cs ...net.Conn) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, c := range cs {
		delete(lb.conns, c)
	}
}

// writerOnly hides every method of a net.Conn but Write, so that io.Copy
// cannot take the ReadFrom (splice) path.
type writerOnly struct{ io.Writer }
