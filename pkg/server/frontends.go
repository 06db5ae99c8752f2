package server

import (
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
)

// frontends is the part of a Server that serves the frontends: the
// /ProxyService/Proxy streams (grpcFrontend, frontend.go) and the HTTP
// CONNECT connections (httpTunnel, httpconnect.go). It has their dials
// started (pendingDials) and hands their tunnels' packets to the relay;
// it counts the frontends being served, for Shutdown, and holds the
// hijacked connections, for Close.
type frontends struct {
	// All set by New. mu is Server.mu, which guards streams and
	// httpTunnels, and lifecycle's flags: a frontend is counted under the
	// same lock as Close is seen.
	mu      *sync.Mutex
	dials   *pendingDials
	relay   *relay
	life    *lifecycle
	metrics *metrics
	mono    clock.Monotonic
	log     klog.Logger
	logs    *logLimiter
	// writeTimeout is Config.FrontendWriteTimeout: how long a frontend
	// may leave what is sent to it unread.
	writeTimeout time.Duration

	// streams counts the gRPC frontend streams being served, and
	// httpTunnels holds the HTTP CONNECT connections taken over, so that
	// Close can end them. Guarded by mu.
	streams     int
	httpTunnels map[*httpTunnel]struct{}
}

// openLocked counts the frontends being served. Called with Server.mu
// held.
func (fs *frontends) openLocked() int { return fs.streams + len(fs.httpTunnels) }

// httpTunnelsLocked returns the HTTP CONNECT connections taken over, for
// Close to end once it has unlocked Server.mu. Called with Server.mu held.
func (fs *frontends) httpTunnelsLocked() []*httpTunnel {
	hts := make([]*httpTunnel, 0, len(fs.httpTunnels))
	for ht := range fs.httpTunnels {
		hts = append(hts, ht)
	}
	return hts
}
