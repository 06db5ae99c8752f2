package server

import (
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/flow"
	"github.com/servercount/servercount/pkg/wire"
)

// grpcFrontend is one /ProxyService/Proxy stream. It may carry several
// dials and connections; connections are named by the agent's connectID.
type grpcFrontend struct {
	s    *Server
	peer *peer
	// pending holds this stream's pending dials by random. Guarded by
	// Server.mu.
	pending map[int64]*tunnel
	// conns holds this stream's connections by connectID. Guarded by
	// Server.mu.
	conns map[int64]*tunnel
}

// Proxy implements client.ProxyServiceServer: it serves one frontend
// stream until it ends or the Server closes. Register it with
// client.RegisterProxyServiceServer.
func (s *Server) Proxy(stream client.ProxyService_ProxyServer) error {
	f := &grpcFrontend{s: s, peer: newPeer(stream, s.metrics, segmentToClient, s.mono), pending: map[int64]*tunnel{}, conns: map[int64]*tunnel{}}
	s.mu.Lock()
	if s.life.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, errShuttingDown.Error())
	}
	s.life.wg.Add(1)
	s.frontendStreams++
	s.metrics.addGRPCConns(methodProxy, 1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.frontendStreams--
		s.mu.Unlock()
		s.life.tunnelMayHaveEnded()
	}()
	s.log.V(2).Info("Frontend connected", "remote", remoteAddr(stream.Context()))
	s.goStream(f.peer, f.serve)
	return s.waitStream(f.peer)
}

// serve is the frontend's receive loop.
func (f *grpcFrontend) serve() {
	s := f.s
	defer s.metrics.addGRPCConns(methodProxy, -1)
	for {
		pkt, err := f.peer.recv(segmentFromClient)
		if err != nil {
			f.gone()
			return
		}
		s.log.V(4).Info("Received packet from frontend", "type", pkt.GetType())
		switch pkt.GetType() {
		case client.PacketType_DIAL_REQ:
			f.dial(pkt)
		case client.PacketType_DIAL_CLS:
			s.cancelDial(f, pkt.GetCloseDial().GetRandom())
		case client.PacketType_DATA:
			f.forward(pkt.GetData().GetConnectID(), pkt)
		case client.PacketType_CLOSE_REQ:
			f.forward(pkt.GetCloseRequest().GetConnectID(), pkt)
		default:
			s.log.V(2).Info("Ignored unexpected packet from frontend", "type", pkt.GetType())
		}
	}
}

// dial handles DIAL_REQ: it forwards the request, unchanged, to the chosen
// agent, or answers it with an error.
func (f *grpcFrontend) dial(pkt *client.Packet) {
	req := pkt.GetDialRequest()
	// The frontend's random is how it matches our answer: without one
	// (0, or no dial request in the packet) no answer could reach it,
	// and a forwarded dial would hang. Refuse it at once.
	if req.GetRandom() == 0 || req.GetAddress() == "" {
		f.s.log.V(2).Info("Refused malformed dial request", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom())
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, "invalid dial request: it needs an address and a non-zero random"), req.GetRandom())
		return
	}
	// As for HTTP CONNECT: an address no agent can dial is answered
	// here, not with a DIAL_REQ and a dial attempt bound to fail.
	if err := checkDialAddress(req.GetAddress()); err != nil {
		f.s.log.V(2).Info("Refused dial request", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom(), "err", err)
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, "invalid dial request: "+err.Error()), req.GetRandom())
		return
	}
	_, be, err := f.s.startDial(f, req.GetProtocol(), req.GetAddress(), req.GetRandom())
	if err != nil {
		f.s.log.V(2).Info("Dial refused", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom(), "err", err)
		// A shutting-down server answers too: during a graceful stop
		// the stream stays open, and an unanswered dial would wait for
		// the client's own timeout.
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, err.Error()), req.GetRandom())
		return
	}
	f.s.log.V(4).Info("Forwarded dial to agent", "agentID", be.logID, "address", capPeer(req.GetAddress()), "dialID", req.GetRandom())
	// If the agent stream has ended, backendGone answers the dial; if
	// this frontend has, gone drops it. If the dial is retried on
	// another agent meanwhile, the one chosen first gets DIAL_CLS after
	// this and answers nothing that counts.
	f.s.relay.sendToAgent(be, pkt, f.peer.done)
}

// forward sends DATA or CLOSE_REQ for connectID to its agent, or answers
// CLOSE_RSP with an error when the connection is unknown.
func (f *grpcFrontend) forward(connectID int64, pkt *client.Packet) {
	f.s.mu.Lock()
	t := f.conns[connectID]
	ending := t != nil && t.ending
	f.s.mu.Unlock()
	if ending {
		// The agent closed it; its CLOSE_RSP follows the data still on
		// its way to this frontend, and answers this packet too.
		return
	}
	if t == nil {
		f.s.log.V(4).Info("Frontend packet matched no connection", "type", pkt.GetType(), "connectionID", connectID)
		// A CLOSE_REQ can cross the agent's CLOSE_RSP for a connection
		// the target closed: the frontend has its answer already.
		if pkt.GetType() != client.PacketType_CLOSE_REQ {
			f.peer.sendControl(wire.CloseRsp(connectID, errTextUnknownConnect), connectID)
		}
		return
	}
	if pkt.GetType() == client.PacketType_DATA {
		if t.credit != nil {
			f.sendCredited(t, pkt.GetData().GetData())
			return
		}
		f.s.relay.sendData(t, pkt, f.peer.done)
		return
	}
	f.s.mu.Lock()
	ob := t.outbox
	if ob != nil {
		t.closeAfterOutbox = true
	}
	f.s.mu.Unlock()
	if ob != nil {
		// CLOSE_REQ goes after the data still waiting for credit.
		ob.CloseWrite()
		return
	}
	f.s.relay.sendCloseReq(t)
}

// sendCredited sends DATA of flow-controlled tunnel t to its agent
// without waiting for credit, so that one tunnel short of credit does not
// hold up the others of this stream (nor their CLOSE_REQ and DIAL_CLS).
// What the credit covers goes now; the rest waits in t's outbox, sent by
// sendOutbox as credit comes. The receive loop waits only when the
// outbox is full too, a window's worth: that is back-pressure on a
// frontend sending faster than its endpoint reads, and it is bounded by
// FrontendWriteTimeout, after which the tunnel is ended.
func (f *grpcFrontend) sendCredited(t *tunnel, data []byte) {
	s := f.s
	s.mu.Lock()
	ob := t.outbox
	s.mu.Unlock()
	for ob == nil && len(data) > 0 {
		n, _ := t.credit.TryTake(min(len(data), wire.MaxDataPayload))
		if n == 0 {
			break
		}
		p := data
		if n < len(data) {
			// Cut with its capacity, so that wire.Recycle does not take
			// a prefix for the whole buffer.
			p = data[:n:n]
		}
		if !s.relay.sendToAgent(t.be, wire.Data(t.connectID, p), f.peer.done) {
			return
		}
		data = data[n:]
	}
	if len(data) == 0 {
		return
	}
	if ob == nil {
		s.mu.Lock()
		if t.be.conns[t.connectID] != t || s.life.closed {
			s.mu.Unlock()
			return // the tunnel is over: its data goes nowhere
		}
		ob = flow.NewBoundedQueue(max(t.be.peerWindow, wire.MaxDataPayload))
		t.outbox = ob
		s.life.wg.Add(1)
		s.mu.Unlock()
		go s.relay.sendOutbox(t, ob, f.peer.done)
	}
	var timer *time.Timer
	for len(data) > 0 {
		n := min(len(data), wire.MaxDataPayload)
		err := ob.Put(data[:n:n])
		if err == nil {
			data = data[n:]
			continue
		}
		if !errors.Is(err, flow.ErrWindowExceeded) {
			return // the tunnel is over
		}
		if timer == nil {
			timer = time.NewTimer(s.cfg.FrontendWriteTimeout)
			defer timer.Stop()
		}
		select {
		case <-ob.Room():
		case <-f.peer.done:
			return
		case <-timer.C:
			s.relay.endStuckTunnel(t, tunnelEndedNoCredit)
			return
		}
	}
}

// gone drops the frontend's pending dials and closes its connections at
// their agents.
func (f *grpcFrontend) gone() {
	f.s.mu.Lock()
	var ts []*tunnel
	for _, t := range f.pending {
		ts = append(ts, t)
	}
	for _, t := range f.conns {
		ts = append(ts, t)
	}
	f.s.mu.Unlock()
	for _, t := range ts {
		f.s.relay.closeFromFrontend(t)
	}
	f.s.log.V(2).Info("Frontend disconnected", "connections", len(ts), "err", f.peer.reason)
}

func (f *grpcFrontend) deliver(pkt *client.Packet, abort <-chan struct{}) {
	if err := f.peer.send(pkt, f.s.cfg.FrontendWriteTimeout, f.s.life.quit, abort); errors.Is(err, errSlowFrontend) {
		f.s.logs.info(f.s.log, "slow-frontend", "Ended a frontend stream that did not read for too long", "timeout", f.s.cfg.FrontendWriteTimeout)
		f.peer.end(errSlowFrontend)
	}
}

func (f *grpcFrontend) answer(pkt *client.Packet) {
	id := pkt.GetCloseResponse().GetConnectID()
	if pkt.GetType() == client.PacketType_DIAL_RSP {
		id = pkt.GetDialResponse().GetRandom()
	}
	f.peer.sendTunnelControl(pkt, id) // always about a dial or tunnel of f's
}

func (f *grpcFrontend) track(t *tunnel) { f.pending[t.random] = t }

func (f *grpcFrontend) established(t *tunnel) bool {
	if f.conns[t.connectID] != nil {
		return false
	}
	f.conns[t.connectID] = t
	return true
}

func (f *grpcFrontend) forget(t *tunnel) {
	if f.pending[t.random] == t {
		delete(f.pending, t.random)
	}
	if t.connectID != 0 && f.conns[t.connectID] == t {
		delete(f.conns, t.connectID)
	}
}
