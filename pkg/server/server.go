package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

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
	// mono reads the times of the streams' liveness checks and of the
	// sweep: the monotonic clock, which no step of the wall clock moves.
	mono clock.Monotonic
	// logs bounds the level-0 lines that many peers can cause at once:
	// rejected agent streams, streams ended, refused claims.
	logs logLimiter

	// mu is the lock of the parts whose state changes together: a dial's
	// answer changes the dial (dials), its agent stream's answer count
	// and unresponsive mark (live) and makes a tunnel of the relay in one
	// step; lifecycle's flags and the frontends' counts are under it so
	// that nothing is added once Close has begun. An established
	// tunnel's packets take it per burst, not per packet (see relay).
	mu sync.Mutex

	// The parts (docs/architecture.md, "The server's parts"), each given
	// by New what it uses of the others, none the Server.
	life      *lifecycle // serving, draining or closed; what Close waits for
	admission admission  // which agent streams are served
	routes    *routes    // the agent streams by agent, for a dial's choice
	live      liveness   // the registered agent streams and their sweep
	dials     pendingDials
	relay     relay // a tunnel's packets, once its dial is answered
	agents    agents
	frontends frontends
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
		cfg:     cfg,
		log:     cfg.Logger.WithName("proxy-server"),
		metrics: m,
		life:    newLifecycle(),
		routes:  newRoutes(),
		mono:    clock.NewMonotonic(nil),
	}
	s.admission = admission{authenticator: cfg.Authenticator, bindIdentifiers: cfg.BindIdentifiers,
		handshakes: handshakes{perAddress: cfg.MaxHandshakesPerAddress, clock: cfg.Clock},
		preAuth:    preAuthConns{m: m, byAddr: cfg.MaxHandshakesPerAddress >= 0, clock: cfg.Clock},
		metrics:    m, log: s.log, logs: &s.logs}
	s.live = liveness{mu: &s.mu, cfg: cfg, mono: s.mono, metrics: m, log: s.log, logs: &s.logs, routes: s.routes, dials: &s.dials}
	s.relay = relay{mu: &s.mu, window: cfg.TunnelWindow, writeTimeout: cfg.FrontendWriteTimeout, life: s.life, dials: &s.dials, metrics: m, log: s.log, logs: &s.logs}
	s.dials = pendingDials{mu: &s.mu, byRandom: map[int64]*tunnel{}, strategies: cfg.Strategies, routes: s.routes, live: &s.live,
		relay: &s.relay, life: s.life, metrics: m, log: s.log, timeout: cfg.BackendDialTimeout}
	s.frontends = frontends{mu: &s.mu, dials: &s.dials, relay: &s.relay, life: s.life, metrics: m, mono: s.mono, log: s.log,
		logs: &s.logs, writeTimeout: cfg.FrontendWriteTimeout, httpTunnels: map[*httpTunnel]struct{}{}}
	s.agents = agents{mu: &s.mu, serverID: cfg.ServerID, counter: cfg.Counter, strategies: cfg.Strategies, window: cfg.TunnelWindow,
		heartbeat: cfg.Heartbeat, admission: &s.admission, routes: s.routes, live: &s.live, dials: &s.dials, relay: &s.relay,
		life: s.life, metrics: m, mono: s.mono, log: s.log, logs: &s.logs}
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
	hts := s.frontends.httpTunnelsLocked()
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
	n := s.dials.len() + s.frontends.openLocked()
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

// Connect implements wire.AgentServiceServer: it checks the handshake
// metadata, sends the serverID and serverCount response headers, and then
// serves the agent's stream until it ends or the Server closes. Register
// it with wire.RegisterAgentServiceServer.
func (s *Server) Connect(stream wire.AgentConnectServer) error {
	return s.agents.serve(stream)
}

// Proxy implements client.ProxyServiceServer: it serves one frontend
// stream until it ends or the Server closes. Register it with
// client.RegisterProxyServiceServer.
func (s *Server) Proxy(stream client.ProxyService_ProxyServer) error {
	return s.frontends.serveProxy(stream)
}
