package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/wire"
)

// Server is a Konnectivity proxy-server core: it implements the agent
// service (/AgentService/Connect), the frontend ProxyService
// (/ProxyService/Proxy) and an HTTP CONNECT frontend. Create it with
// [New] and end it with [Close]. It is safe for concurrent use.
type Server struct {
	cfg     Config
	log     klog.Logger
	metrics *metrics
	// life says whether the Server serves, drains or is closed; its
	// flags are guarded by mu.
	life *lifecycle

	mu sync.Mutex
	// routes indexes the agent streams by agent, for choosing one for a
	// dial; it has its own lock.
	routes *routes
	// admission decides which agent streams are served.
	admission admission
	// mono reads the times of the streams' liveness checks and of the
	// sweep: the monotonic clock, which no step of the wall clock moves.
	mono clock.Monotonic
	// logs bounds the level-0 lines that many peers can cause at once:
	// rejected agent streams, streams ended, refused claims.
	logs logLimiter
	// live holds and checks the registered agent streams. Guarded by
	// mu.
	live liveness
	// dials holds the dials sent to an agent and not yet answered.
	// Guarded by mu.
	dials pendingDials
	// relay carries the tunnels' packets once their dials are answered.
	relay relay
	// httpTunnels holds the HTTP CONNECT tunnels, so that Close can end
	// them. Guarded by mu.
	httpTunnels map[*httpTunnel]struct{}
	// frontendStreams counts the gRPC frontend streams being served.
	// Guarded by mu.
	frontendStreams int
}

// New validates cfg and returns a Server, or an error that lists every
// problem in cfg.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("invalid proxy-server configuration: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger.WithName("proxy-server"),
		metrics:     m,
		life:        newLifecycle(),
		routes:      newRoutes(),
		mono:        clock.NewMonotonic(nil),
		httpTunnels: map[*httpTunnel]struct{}{},
	}
	s.admission = admission{authenticator: cfg.Authenticator, bindIdentifiers: cfg.BindIdentifiers,
		handshakes: handshakes{perAddress: cfg.MaxHandshakesPerAddress, clock: cfg.Clock},
		preAuth:    preAuthConns{m: m, byAddr: cfg.MaxHandshakesPerAddress >= 0, clock: cfg.Clock},
		metrics:    m, log: s.log, logs: &s.logs}
	s.live = liveness{mu: &s.mu, cfg: cfg, mono: s.mono, metrics: m, log: s.log, logs: &s.logs, routes: s.routes, dials: &s.dials}
	s.relay = relay{mu: &s.mu, cfg: cfg, life: s.life, dials: &s.dials, metrics: m, log: s.log, logs: &s.logs}
	s.dials = pendingDials{byRandom: map[int64]*tunnel{}, routes: s.routes, life: s.life, metrics: m, log: s.log,
		timeout: cfg.BackendDialTimeout, timedOut: s.dialTimedOut}
	return s, nil
}

// Config returns the configuration the Server runs with: cfg as New
// took it, every default applied.
func (s *Server) Config() Config { return s.cfg }

// Close ends every agent stream, frontend stream and HTTP CONNECT tunnel,
// and waits for the goroutines the Server started. Streams that arrive
// later are refused with codes.Unavailable. Close may be called more than
// once.
func (s *Server) Close() {
	s.mu.Lock()
	if s.life.closed {
		s.mu.Unlock()
		s.life.wg.Wait()
		return
	}
	s.life.closed = true
	s.dials.stopTimers()
	var hts []*httpTunnel
	for ht := range s.httpTunnels {
		hts = append(hts, ht)
	}
	s.mu.Unlock()
	close(s.life.quit)
	for _, ht := range hts {
		ht.closeConn()
	}
	s.life.wg.Wait()
}

// Ready reports whether at least one agent is connected and the Server
// is not stopping.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live.all()) > 0 && !s.life.notReady
}

// StopReadiness makes Ready, and so /readyz, fail from now on, while the
// Server goes on serving: the first step of a graceful stop, so that load
// balancers and Service endpoints stop sending frontends here before
// Shutdown refuses them.
func (s *Server) StopReadiness() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.life.notReady = true
}

// Shutdown stops the Server gracefully. It stops readiness, refuses new
// dials and agent streams, and tells every agent that this server is
// going away (DRAIN, which upstream's agents ignore and ours take as a
// cue to connect to another server, keeping this one's tunnels); then it
// waits until every tunnel has ended and every frontend has read its last
// packet and gone (a gRPC frontend stream, an HTTP CONNECT connection),
// or until ctx ends, and closes the Server, cutting what is left. It
// returns the number of tunnels and frontends it cut. The caller stops
// its listeners first: Shutdown does not listen.
func (s *Server) Shutdown(ctx context.Context) (cut int) {
	s.mu.Lock()
	s.life.notReady, s.life.shuttingDown = true, true
	streams := slices.Clone(s.live.all())
	s.mu.Unlock()
	for _, be := range streams {
		be.peer.sendControl(wire.Drain(), 0)
	}
	for {
		n := s.openTunnels()
		if n == 0 {
			break
		}
		select {
		case <-s.life.tunnelEnded:
			continue
		case <-ctx.Done():
			cut = n
		}
		break
	}
	s.Close()
	return cut
}

// openTunnels counts the tunnels that have not ended: pending dials,
// established connections, those whose last data is still on its way to
// the frontend or whose CLOSE_REQ waits (sendCloseReq), and the frontends
// themselves (HTTP CONNECT connections and gRPC streams), which end once
// their client has read its last packet.
func (s *Server) openTunnels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.dials.len() + len(s.httpTunnels) + s.frontendStreams
	for _, be := range s.live.all() {
		n += len(be.conns) + len(be.closing)
	}
	return n + int(s.life.pumps.Load())
}

// Backends returns the number of connected agent streams.
func (s *Server) Backends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live.all())
}

// goStream starts p's receive loop recv. The caller has done s.life.wg.Add(1)
// under s.mu, having checked s.life.closed, so that Close waits for it, and
// through it for p's writer (stopWriter).
func (s *Server) goStream(p *peer, recv func()) {
	go func() {
		defer s.life.wg.Done()
		defer p.stopWriter()
		recv()
	}()
}

// waitStream blocks the gRPC handler until p ends, its client goes away
// or the Server closes, and returns the handler's status. Returning
// cancels the stream's context, which ends p's receive loop and writer
// even when they are blocked in Recv or Send: that is why neither runs on
// the handler's goroutine. The client's going away is watched here, not
// only through Recv, because the receive loop may be waiting for room in
// an agent's queue instead of receiving. An agent stream's liveness is
// the sweep's (sweep.go), which ends p when it is stuck or its agent dead.
func (s *Server) waitStream(p *peer) error {
	select {
	case <-p.done:
	case <-p.stream.Context().Done():
		p.end(p.stream.Context().Err())
	case <-s.life.quit:
		p.end(errShuttingDown)
	}
	switch err := p.reason; {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, errShuttingDown):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errSlowFrontend), errors.Is(err, errControlBacklog):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errStalled), errors.Is(err, errSilent), errors.Is(err, errReceiveStuck), errors.Is(err, errUnresponsive):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.Unknown, err.Error())
	}
}
