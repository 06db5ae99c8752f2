// Package serve holds what both proxy binaries do alike: listening,
// serving HTTP endpoints (health, metrics, pprof), TLS policy flags, and
// shutting down in order on a signal.
package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// Registry is where a binary registers its metrics and where /metrics
// reads them: a *prometheus.Registry, or one that also keeps a list of
// what is registered (the metric reference's generator).
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// MetricsHandler serves reg's metrics.
func MetricsHandler(reg Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// AdminMux serves /metrics, and pprof under /debug/pprof/ when profiling.
func AdminMux(reg Registry, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", MetricsHandler(reg))
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Listen listens on TCP host:port, naming what the port is for in the
// error.
func Listen(what, host string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(host, fmt.Sprint(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for %s on %s: %w", what, addr, err)
	}
	return l, nil
}

// Group runs servers and stops them together.
type Group struct {
	errc  chan error
	n     int
	stops []func(context.Context)
	// conns, if set, counts the open connections of each HTTP server;
	// see CountHTTPConnections.
	conns *prometheus.GaugeVec
}

// NewHTTPConnectionsGauge returns the gauge for
// [Group.CountHTTPConnections], named <namespace>_<subsystem>_http_open_connections,
// with a "server" label.
func NewHTTPConnectionsGauge(namespace, subsystem string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "http_open_connections",
		Help: "Number of open client connections of each HTTP server (health, admin, HTTP CONNECT frontend), idle keep-alive ones included; an HTTP CONNECT tunnel leaves it once established.",
	}, []string{"server"})
}

// CountHTTPConnections makes the HTTP servers the group runs from now on
// count their open connections in v (made by [NewHTTPConnectionsGauge]),
// labelled with the server's name less its " server" suffix: each is a
// client holding a socket and a goroutine, bounded by HTTPLimits.
func (g *Group) CountHTTPConnections(v *prometheus.GaugeVec) { g.conns = v }

// NewGroup returns an empty group.
func NewGroup() *Group { return &Group{errc: make(chan error, 16)} }

// Go runs serve, which must return once stop has been called.
func (g *Group) Go(name string, serve func() error, stop func(context.Context)) {
	g.n++
	g.stops = append(g.stops, stop)
	go func() {
		err := serve()
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			err = fmt.Errorf("%s: %w", name, err)
		} else {
			err = nil
		}
		g.errc <- err
	}()
}

// Defer adds a step to the shutdown, run before the stops of the servers
// added so far.
func (g *Group) Defer(stop func(context.Context)) {
	g.stops = append(g.stops, stop)
}

// GRPC runs a gRPC server on l. Stopping waits for its streams to end
// until the grace period is over, then cuts them.
func (g *Group) GRPC(name string, l net.Listener, s *grpc.Server) {
	g.Go(name, func() error { return s.Serve(l) }, func(ctx context.Context) {
		done := make(chan struct{})
		go func() {
			s.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.Stop()
			<-done
		}
	})
}

// HTTP runs an HTTP server for h on l, with the default [HTTPLimits],
// and returns it, for a caller that stops it sooner.
func (g *Group) HTTP(name string, l net.Listener, h http.Handler) *http.Server {
	srv := NewHTTPServer(h, HTTPLimits{})
	if g.conns != nil {
		open := g.conns.WithLabelValues(strings.TrimSuffix(name, " server"))
		srv.ConnState = func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				open.Inc()
			case http.StateClosed, http.StateHijacked:
				open.Dec()
			}
		}
	}
	g.Go(name, func() error { return srv.Serve(l) }, func(ctx context.Context) { _ = srv.Shutdown(ctx) })
	return srv
}

// The default HTTP limits. Every port the binaries serve over HTTP
// (health, admin, HTTP CONNECT) is reachable by peers we do not trust, and
// net/http's zero values mean no limit: an idle keep-alive connection was
// held for ever, a client could take as long as it liked to send its
// headers, and headers could reach 1 MiB.
const (
	// DefaultHTTPReadHeaderTimeout bounds the wait for a request's
	// headers: a slow-loris client is cut after it.
	DefaultHTTPReadHeaderTimeout = 10 * time.Second
	// DefaultHTTPIdleTimeout closes a keep-alive connection with no
	// request for this long. It is longer than a 60 s scrape interval,
	// so that a scraper keeps reusing its connection, and matches the
	// 90 s for which Go's http.Transport keeps idle connections.
	DefaultHTTPIdleTimeout = 90 * time.Second
	// DefaultHTTPMaxHeaderBytes bounds a request's headers. Health checks,
	// scrapes, pprof and CONNECT requests send a few hundred bytes; the
	// proxy-server's gRPC ports allow the same 64 KiB.
	DefaultHTTPMaxHeaderBytes = 64 << 10
)

// HTTPLimits bound what one client may make an HTTP server hold. The zero
// value of each field means its Default.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds the time to read a request's headers.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a keep-alive
	// connection. A hijacked connection (an HTTP CONNECT tunnel) is no
	// longer the server's, and is not affected.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the size of a request's headers; larger
	// requests are answered 431.
	MaxHeaderBytes int
}

// NewHTTPServer returns an http.Server for h with lim's limits.
func NewHTTPServer(h http.Handler, lim HTTPLimits) *http.Server {
	if lim.ReadHeaderTimeout <= 0 {
		lim.ReadHeaderTimeout = DefaultHTTPReadHeaderTimeout
	}
	if lim.IdleTimeout <= 0 {
		lim.IdleTimeout = DefaultHTTPIdleTimeout
	}
	if lim.MaxHeaderBytes <= 0 {
		lim.MaxHeaderBytes = DefaultHTTPMaxHeaderBytes
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
	}
}

// Wait blocks until ctx ends or a server fails, then stops every server
// in the reverse order of Go, each bounded by grace, and waits for them.
// It returns the first server failure.
func (g *Group) Wait(ctx context.Context, grace time.Duration) error {
	var first error
	select {
	case <-ctx.Done():
	case first = <-g.errc:
		g.n--
	}
	if first != nil {
		klog.ErrorS(first, "Server failed, shutting down")
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	for i := len(g.stops) - 1; i >= 0; i-- {
		g.stops[i](sctx)
	}
	for ; g.n > 0; g.n-- {
		if err := <-g.errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}
