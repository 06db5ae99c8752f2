package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/outage"
	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/servercounter"
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
	// conns holds the established connections by connectID, and closing
	// the connectIDs whose CLOSE_REQ waits out PlainAgentCloseDelay (see
	// sendCloseReq). Both are changed with Server.mu and connMu held, and
	// read with either: the stream's receive loop finds the tunnel of
	// each DATA and WINDOW under connMu alone, which no other agent's
	// packets contend on.
	connMu  sync.Mutex
	conns   map[int64]*tunnel
	closing map[int64]struct{}
	// pending holds the dials sent on this stream, by random. Guarded by
	// Server.mu.
	pending map[int64]*tunnel
}

// agents is the part of a Server that serves the agent streams: it has a
// stream admitted (admission), answers its handshake, registers it with
// the routes and the sweep (liveness), runs its receive loop, which hands
// each packet to the dials or the relay, and when the stream ends fails
// the dials and tunnels that went through it.
type agents struct {
	// All set by New. mu is Server.mu.
	mu         *sync.Mutex
	serverID   string
	counter    servercounter.ServerCounter
	strategies []Strategy
	// window and heartbeat are Config.TunnelWindow and Config.Heartbeat:
	// what the server offers an agent that offers flow control or
	// heartbeats.
	window    int
	heartbeat time.Duration
	admission *admission
	routes    *routes
	live      *liveness
	dials     *pendingDials
	relay     *relay
	life      *lifecycle
	metrics   *metrics
	mono      clock.Monotonic
	log       klog.Logger
	logs      *logLimiter
}

// serve checks an agent stream's handshake metadata, sends the serverID
// and serverCount response headers, and then serves the stream as an
// agentStream until it ends or the Server closes.
func (a *agents) serve(stream wire.AgentConnectServer) error {
	ctx := stream.Context()
	if a.stopping() {
		a.metrics.observeAgentRejection(rejectShuttingDown)
		return status.Error(codes.Unavailable, errShuttingDown.Error())
	}
	agentID, ids, err := a.admission.handshake(ctx)
	if err != nil {
		return err
	}
	if a.routes.streams(agentID) >= MaxStreamsPerAgent {
		// Refused before the response headers, which tell the agent it
		// is served; add checks again, under the same lock as it
		// adds.
		return a.admission.refuseTooManyStreams(ctx, agentID)
	}
	count := a.counter.CountServers()
	hdr := metadata.Pairs(wire.HeaderServerID, a.serverID, wire.HeaderServerCount, strconv.Itoa(count))
	// Flow control only when the agent offers it (upstream's does not).
	peerWindow := 0
	if a.window > 0 {
		md, _ := metadata.FromIncomingContext(ctx)
		if w, ok := wire.ParseTunnelWindow(md.Get(wire.HeaderTunnelWindow)); ok {
			peerWindow = w
			hdr.Set(wire.HeaderTunnelWindow, strconv.Itoa(a.window))
		}
	}
	// Heartbeats, too, only when the agent offers them.
	var peerHeartbeat time.Duration
	if a.heartbeat > 0 {
		md, _ := metadata.FromIncomingContext(ctx)
		if d, ok := wire.ParseHeartbeat(md.Get(wire.HeaderHeartbeat)); ok {
			peerHeartbeat = d
			hdr.Set(wire.HeaderHeartbeat, wire.FormatHeartbeat(a.heartbeat))
		}
	}
	// Set before the header goes, so that whoever has read the header
	// finds the count it carried (TestHandshakeHeadersFollowCounter).
	a.metrics.setReportedServerCount(count)
	if err := stream.SendHeader(hdr); err != nil {
		return fmt.Errorf("send handshake headers to agent %q: %w", capPeer(agentID), err)
	}

	be := &agentStream{agentID: agentID, logID: capPeer(agentID), ids: ids, hostKeys: hostKeys(ids), peer: newPeer(stream, a.metrics, segmentToAgent, a.mono), conns: map[int64]*tunnel{}, pending: map[int64]*tunnel{}, peerWindow: peerWindow, peerHeartbeat: peerHeartbeat,
		answering: outage.New("have dials answered by agent "+capPeer(agentID), nil)}
	contested, err := a.add(be)
	switch {
	case errors.Is(err, errTooManyStreams):
		return a.admission.refuseTooManyStreams(ctx, agentID)
	case err != nil:
		a.metrics.observeAgentRejection(rejectShuttingDown)
		return status.Error(codes.Unavailable, err.Error())
	}
	a.log.V(2).Info("Agent connected", "agentID", be.logID, "identifiers", capPeer(ids.String()), "serverCount", count, "remote", remoteAddr(ctx))
	a.logContested(be, contested, remoteAddr(ctx))
	return be.peer.wait(a.life.quit)
}

// stopping reports whether Shutdown or Close has begun.
func (a *agents) stopping() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.life.stoppingLocked()
}

// errTooManyStreams refuses a stream of an agent that holds
// MaxStreamsPerAgent.
var errTooManyStreams = errors.New("this agent holds the most streams to this server that one agent may: it needs one")

// add registers be and starts its goroutines. It returns the hosts
// be claims that other agents hold, with the stream that holds each, or
// the error to end be with: the Server is closing, or be's agent holds
// MaxStreamsPerAgent streams already.
func (a *agents) add(be *agentStream) (contested map[string]*agentStream, err error) {
	a.mu.Lock()
	if a.life.stoppingLocked() {
		a.mu.Unlock()
		return nil, errShuttingDown
	}
	if contested, err = a.routes.add(be); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	a.live.addLocked(be, &a.life.wg, a.life.quit)
	a.metrics.addBackends(1)
	a.metrics.addGRPCConns(methodAgentConnect, 1)
	a.countReady(be, 1)
	a.life.wg.Add(1)
	a.mu.Unlock()
	a.life.goStream(be.peer, func() { a.receiveLoop(be) })
	return contested, nil
}

// logContested logs and counts the hosts that be claims and that streams
// of other agents, holding them, are given: one line per stream, at level
// 0, since it is what an agent claiming another node's traffic looks like.
func (a *agents) logContested(be *agentStream, contested map[string]*agentStream, remote string) {
	if len(contested) == 0 {
		return
	}
	a.metrics.observeContestedClaims(len(contested))
	holders := make([]string, 0, len(contested))
	for k, holder := range contested {
		holders = append(holders, k+" by "+holder.logID)
	}
	slices.Sort(holders)
	a.logs.info(a.log, "contested", "Agent claims hosts that other agents hold: it gets none of their dials while those are connected", "agentID", be.logID, "heldBy", capPeer(strings.Join(holders, ",")), "remote", remote)
}

// removeLocked unregisters be, which add registered, once.
func (a *agents) removeLocked(be *agentStream) {
	if be.gone {
		return
	}
	be.gone = true
	a.routes.remove(be)
	a.live.removeLocked(be)
	a.metrics.addBackends(-1)
	a.metrics.addGRPCConns(methodAgentConnect, -1)
	a.countReady(be, -1)
}

// receiveLoop is be's receive loop.
func (a *agents) receiveLoop(be *agentStream) {
	for {
		pkt, err := be.peer.recv(segmentFromAgent)
		if err != nil {
			a.log.V(2).Info("Agent disconnected", "agentID", be.logID, "err", err)
			a.ended(be)
			return
		}
		be.peer.arrived(pkt)
		a.log.V(4).Info("Received packet from agent", "agentID", be.logID, "type", pkt.GetType())
		switch pkt.GetType() {
		case client.PacketType_DIAL_RSP:
			a.dials.answer(be, pkt)
		case client.PacketType_DATA:
			a.relay.onAgentData(be, pkt)
		case client.PacketType_CLOSE_RSP:
			a.relay.onAgentCloseResponse(be, pkt)
		case wire.PacketWindow:
			a.relay.onWindowUpdate(be, pkt)
		case client.PacketType_DRAIN:
			if !be.draining.Swap(true) {
				a.routes.setDraining(be)
				a.log.V(2).Info("Agent is draining", "agentID", be.logID)
			}
		case wire.PacketHeartbeat:
			// Its arrival is all it says: the agent is alive.
		default:
			a.log.V(2).Info("Ignored unexpected packet from agent", "agentID", be.logID, "type", pkt.GetType())
		}
	}
}

// countReady adds n to ready_backends for each configured strategy
// that could pick be.
func (a *agents) countReady(be *agentStream, n int) {
	for _, st := range a.strategies {
		if st == StrategyDestHost && len(be.ids.Host)+len(be.ids.IPv4)+len(be.ids.IPv6) == 0 || st == StrategyDefaultRoute && !be.ids.DefaultRoute {
			continue
		}
		a.metrics.addReadyBackend(st, n)
	}
}

func remoteAddr(ctx context.Context) string {
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// ended unregisters agent stream be and tells every frontend with a
// dial or a connection through it.
func (a *agents) ended(be *agentStream) {
	a.mu.Lock()
	a.removeLocked(be)
	var dials, conns []*tunnel
	for _, t := range be.pending {
		dials = append(dials, t)
	}
	for _, t := range dials {
		a.dials.drop(t, dialFailureBackendClose)
	}
	for _, t := range be.conns {
		conns = append(conns, t)
	}
	var direct []*tunnel
	for _, t := range conns {
		if a.relay.closeFromAgentLocked(t, wire.CloseRsp(t.connectID, errTextAgentGone)) {
			direct = append(direct, t)
		}
	}
	a.mu.Unlock()
	// The answers say why the stream ended, without waiting: this runs
	// on the stream's receive loop.
	why := ""
	if err := be.peer.reason; err != nil && !errors.Is(err, io.EOF) {
		why = ": " + capPeer(err.Error())
	}
	for _, t := range dials {
		t.fe.answer(wire.DialRsp(t.random, 0, errTextBackendClosed+why))
	}
	for _, t := range direct {
		t.fe.answer(wire.CloseRsp(t.connectID, errTextAgentGone+why))
	}
}
