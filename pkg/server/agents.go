package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/outage"
	"github.com/servercount/servercount/pkg/wire"
)

// agentStream is one agent Connect stream (be, in variables).
type agentStream struct {
	agentID string
	logID   string // agentID cut for logs by capPeer
	ids     wire.Identifiers
	// hostKeys are the hostKeys of ids' host, ipv4 and ipv6 identifiers,
	// each once: what destHost finds the stream by.
	hostKeys []string
	peer     *peer
	seq      uint64 // connection order, lower is older; set by routes.add
	// gone is set when the stream is unregistered. Guarded by Server.mu.
	gone bool
	// sweepIndex is the stream's place in liveness.swept while it is
	// registered. Guarded by Server.mu.
	sweepIndex int
	// route is the stream's agent in Server.routes and routeTier its
	// tier there, from draining and routeUnresponsive (unresponsive as
	// routes knows it, since that field is Server.mu's). All guarded by
	// routes.mu.
	route             *routeAgent
	routeTier         int
	routeUnresponsive bool
	// peerWindow is the agent's flow-control window per tunnel, 0 when
	// the handshake did not turn flow control on.
	peerWindow int
	// peerHeartbeat is the agent's heartbeat interval, 0 when the
	// handshake did not turn heartbeats on.
	peerHeartbeat time.Duration
	// draining is set when the agent sends DRAIN on this stream.
	draining atomic.Bool
	// unresponsive is when the agent was taken for unresponsive (see
	// Config.UnansweredDialTimeout), zero while it is not. Guarded by
	// Server.mu.
	unresponsive time.Time
	// timeouts counts the backend dial timeouts in a row, with no
	// DIAL_RSP between them. Guarded by Server.mu.
	timeouts int
	// answering logs, at level 0, that the agent stopped answering dials
	// and that it answers again, once per outage.
	answering *outage.Outage
	// conns holds the established connections by connectID. Guarded by
	// Server.mu.
	conns map[int64]*tunnel
	// pending holds the dials sent on this stream, by random. Guarded by
	// Server.mu.
	pending map[int64]*tunnel
	// closing holds the connectIDs whose CLOSE_REQ waits out
	// PlainAgentCloseDelay (see sendCloseReq). Guarded by Server.mu.
	closing map[int64]struct{}
}

// Connect implements wire.AgentServiceServer: it checks the handshake
// metadata, sends the serverID and serverCount response headers, and then
// serves the stream as an agentStream until it ends or the Server closes.
func (s *Server) Connect(stream wire.AgentConnectServer) error {
	ctx := stream.Context()
	if s.stopping() {
		s.metrics.observeAgentRejection(rejectShuttingDown)
		return status.Error(codes.Unavailable, errShuttingDown.Error())
	}
	agentID, ids, err := s.admission.handshake(ctx)
	if err != nil {
		return err
	}
	if s.routes.streams(agentID) >= MaxStreamsPerAgent {
		// Refused before the response headers, which tell the agent it
		// is served; addBackend checks again, under the same lock as it
		// adds.
		return s.admission.refuseTooManyStreams(ctx, agentID)
	}
	count := s.cfg.Counter.CountServers()
	hdr := metadata.Pairs(wire.HeaderServerID, s.cfg.ServerID, wire.HeaderServerCount, strconv.Itoa(count))
	// Flow control only when the agent offers it (upstream's does not).
	peerWindow := 0
	if s.cfg.TunnelWindow > 0 {
		md, _ := metadata.FromIncomingContext(ctx)
		if w, ok := wire.ParseTunnelWindow(md.Get(wire.HeaderTunnelWindow)); ok {
			peerWindow = w
			hdr.Set(wire.HeaderTunnelWindow, strconv.Itoa(s.cfg.TunnelWindow))
		}
	}
	// Heartbeats, too, only when the agent offers them.
	var peerHeartbeat time.Duration
	if s.cfg.Heartbeat > 0 {
		md, _ := metadata.FromIncomingContext(ctx)
		if d, ok := wire.ParseHeartbeat(md.Get(wire.HeaderHeartbeat)); ok {
			peerHeartbeat = d
			hdr.Set(wire.HeaderHeartbeat, wire.FormatHeartbeat(s.cfg.Heartbeat))
		}
	}
	if err := stream.SendHeader(hdr); err != nil {
		return fmt.Errorf("send handshake headers to agent %q: %w", capPeer(agentID), err)
	}
	s.metrics.setReportedServerCount(count)

	be := &agentStream{agentID: agentID, logID: capPeer(agentID), ids: ids, hostKeys: hostKeys(ids), peer: newPeer(stream, s.metrics, segmentToAgent, s.mono), conns: map[int64]*tunnel{}, pending: map[int64]*tunnel{}, peerWindow: peerWindow, peerHeartbeat: peerHeartbeat,
		answering: outage.New("have dials answered by agent "+capPeer(agentID), nil)}
	contested, err := s.addBackend(be)
	switch {
	case errors.Is(err, errTooManyStreams):
		return s.admission.refuseTooManyStreams(ctx, agentID)
	case err != nil:
		s.metrics.observeAgentRejection(rejectShuttingDown)
		return status.Error(codes.Unavailable, err.Error())
	}
	s.log.V(2).Info("Agent connected", "agentID", be.logID, "identifiers", capPeer(ids.String()), "serverCount", count, "remote", remoteAddr(ctx))
	s.logContested(be, contested, remoteAddr(ctx))
	return s.waitStream(be.peer)
}

// stopping reports whether Shutdown or Close has begun.
func (s *Server) stopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.life.stoppingLocked()
}

// errTooManyStreams refuses a stream of an agent that holds
// MaxStreamsPerAgent.
var errTooManyStreams = errors.New("this agent holds the most streams to this server that one agent may: it needs one")

// addBackend registers be and starts its goroutines. It returns the hosts
// be claims that other agents hold, with the stream that holds each, or
// the error to end be with: the Server is closing, or be's agent holds
// MaxStreamsPerAgent streams already.
func (s *Server) addBackend(be *agentStream) (contested map[string]*agentStream, err error) {
	s.mu.Lock()
	if s.life.stoppingLocked() {
		s.mu.Unlock()
		return nil, errShuttingDown
	}
	if contested, err = s.routes.add(be); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.live.addLocked(be, &s.life.wg, s.life.quit)
	s.metrics.addBackends(1)
	s.metrics.addGRPCConns(methodAgentConnect, 1)
	s.countReadyBackend(be, 1)
	s.life.wg.Add(1)
	s.mu.Unlock()
	s.goStream(be.peer, func() { s.serveAgent(be) })
	return contested, nil
}

// logContested logs and counts the hosts that be claims and that streams
// of other agents, holding them, are given: one line per stream, at level
// 0, since it is what an agent claiming another node's traffic looks like.
func (s *Server) logContested(be *agentStream, contested map[string]*agentStream, remote string) {
	if len(contested) == 0 {
		return
	}
	s.metrics.observeContestedClaims(len(contested))
	holders := make([]string, 0, len(contested))
	for k, holder := range contested {
		holders = append(holders, k+" by "+holder.logID)
	}
	slices.Sort(holders)
	s.logs.info(s.log, "contested", "Agent claims hosts that other agents hold: it gets none of their dials while those are connected", "agentID", be.logID, "heldBy", capPeer(strings.Join(holders, ",")), "remote", remote)
}

// removeBackendLocked unregisters be, which addBackend registered, once.
func (s *Server) removeBackendLocked(be *agentStream) {
	if be.gone {
		return
	}
	be.gone = true
	s.routes.remove(be)
	s.live.removeLocked(be)
	s.metrics.addBackends(-1)
	s.metrics.addGRPCConns(methodAgentConnect, -1)
	s.countReadyBackend(be, -1)
}

// serveAgent is be's receive loop.
func (s *Server) serveAgent(be *agentStream) {
	for {
		pkt, err := be.peer.recv(segmentFromAgent)
		if err != nil {
			s.log.V(2).Info("Agent disconnected", "agentID", be.logID, "err", err)
			s.backendGone(be)
			return
		}
		be.peer.arrived(pkt)
		s.log.V(4).Info("Received packet from agent", "agentID", be.logID, "type", pkt.GetType())
		switch pkt.GetType() {
		case client.PacketType_DIAL_RSP:
			s.onDialResponse(be, pkt)
		case client.PacketType_DATA:
			s.relay.onAgentData(be, pkt)
		case client.PacketType_CLOSE_RSP:
			s.relay.onAgentCloseResponse(be, pkt)
		case wire.PacketWindow:
			s.relay.onWindowUpdate(be, pkt)
		case client.PacketType_DRAIN:
			if !be.draining.Swap(true) {
				s.routes.setDraining(be)
				s.log.V(2).Info("Agent is draining", "agentID", be.logID)
			}
		case wire.PacketHeartbeat:
			// Its arrival is all it says: the agent is alive.
		default:
			s.log.V(2).Info("Ignored unexpected packet from agent", "agentID", be.logID, "type", pkt.GetType())
		}
	}
}

// countReadyBackend adds n to ready_backends for each configured strategy
// that could pick be.
func (s *Server) countReadyBackend(be *agentStream, n int) {
	for _, st := range s.cfg.Strategies {
		if st == StrategyDestHost && len(be.ids.Host)+len(be.ids.IPv4)+len(be.ids.IPv6) == 0 || st == StrategyDefaultRoute && !be.ids.DefaultRoute {
			continue
		}
		s.metrics.addReadyBackend(st, n)
	}
}

func remoteAddr(ctx context.Context) string {
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
