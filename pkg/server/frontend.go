package server

import (
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// grpcFrontend is one /ProxyService/Proxy stream. It may carry several
// dials and connections; connections are named by the agent's connectID.
type grpcFrontend struct {
	fs   *frontends
	peer *peer
	// connMu guards pending and conns, changed with Server.mu held too
	// (the frontend methods below are called under it): the stream's
	// receive loop finds a tunnel under connMu alone, which no other
	// frontend's packets contend on.
	connMu sync.Mutex
	// pending holds this stream's pending dials by random.
	pending map[int64]*tunnel
	// conns holds this stream's connections by connectID.
	conns map[int64]*tunnel
}

// serveProxy serves one /ProxyService/Proxy stream until it ends or the
// Server closes.
func (fs *frontends) serveProxy(stream client.ProxyService_ProxyServer) error {
	f := &grpcFrontend{fs: fs, peer: newPeer(stream, fs.metrics, segmentToClient, fs.mono), pending: map[int64]*tunnel{}, conns: map[int64]*tunnel{}}
	fs.mu.Lock()
	if fs.life.closed {
		fs.mu.Unlock()
		return status.Error(codes.Unavailable, errShuttingDown.Error())
	}
	fs.life.wg.Add(1)
	fs.streams++
	fs.metrics.addGRPCConns(methodProxy, 1)
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		fs.streams--
		fs.mu.Unlock()
		fs.life.tunnelMayHaveEnded()
	}()
	fs.log.V(2).Info("Frontend connected", "remote", remoteAddr(stream.Context()))
	fs.life.goStream(f.peer, f.serve)
	return f.peer.wait(fs.life.quit)
}

// serve is the frontend's receive loop.
func (f *grpcFrontend) serve() {
	fs := f.fs
	defer fs.metrics.addGRPCConns(methodProxy, -1)
	for {
		pkt, err := f.peer.recv(segmentFromClient)
		if err != nil {
			f.gone()
			return
		}
		fs.log.V(4).Info("Received packet from frontend", "type", pkt.GetType())
		switch pkt.GetType() {
		case client.PacketType_DIAL_REQ:
			f.dial(pkt)
		case client.PacketType_DIAL_CLS:
			fs.dials.cancel(f, pkt.GetCloseDial().GetRandom())
		case client.PacketType_DATA:
			f.forward(pkt.GetData().GetConnectID(), pkt)
		case client.PacketType_CLOSE_REQ:
			f.forward(pkt.GetCloseRequest().GetConnectID(), pkt)
		default:
			fs.log.V(2).Info("Ignored unexpected packet from frontend", "type", pkt.GetType())
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
		f.fs.log.V(2).Info("Refused malformed dial request", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom())
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, "invalid dial request: it needs an address and a non-zero random"), req.GetRandom())
		return
	}
	// As for HTTP CONNECT: an address no agent can dial is answered
	// here, not with a DIAL_REQ and a dial attempt bound to fail.
	if err := checkDialAddress(req.GetAddress()); err != nil {
		f.fs.log.V(2).Info("Refused dial request", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom(), "err", err)
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, "invalid dial request: "+err.Error()), req.GetRandom())
		return
	}
	_, be, err := f.fs.dials.start(f, req.GetProtocol(), req.GetAddress(), req.GetRandom())
	if err != nil {
		f.fs.log.V(2).Info("Dial refused", "address", capPeer(req.GetAddress()), "dialID", req.GetRandom(), "err", err)
		// A shutting-down server answers too: during a graceful stop
		// the stream stays open, and an unanswered dial would wait for
		// the client's own timeout.
		f.peer.sendControl(wire.DialRsp(req.GetRandom(), 0, err.Error()), req.GetRandom())
		return
	}
	f.fs.log.V(4).Info("Forwarded dial to agent", "agentID", be.logID, "address", capPeer(req.GetAddress()), "dialID", req.GetRandom())
	// If the agent stream has ended, agents.ended answers the dial; if
	// this frontend has, gone drops it. If the dial is retried on
	// another agent meanwhile, the one chosen first gets DIAL_CLS after
	// this and answers nothing that counts.
	f.fs.relay.sendToAgent(be, pkt, f.peer.done)
}

// forward sends DATA or CLOSE_REQ for connectID to its agent, or answers
// CLOSE_RSP with an error when the connection is unknown.
func (f *grpcFrontend) forward(connectID int64, pkt *client.Packet) {
	f.connMu.Lock()
	t := f.conns[connectID]
	f.connMu.Unlock()
	if t != nil && t.ending.Load() {
		// The agent closed it; its CLOSE_RSP follows the data still on
		// its way to this frontend, and answers this packet too.
		return
	}
	if t == nil {
		f.fs.log.V(4).Info("Frontend packet matched no connection", "type", pkt.GetType(), "connectionID", connectID)
		// A CLOSE_REQ can cross the agent's CLOSE_RSP for a connection
		// the target closed: the frontend has its answer already.
		if pkt.GetType() != client.PacketType_CLOSE_REQ {
			f.peer.sendControl(wire.CloseRsp(connectID, errTextUnknownConnect), connectID)
		}
		return
	}
	if pkt.GetType() == client.PacketType_DATA {
		if t.credit != nil {
			f.fs.relay.sendCredited(t, pkt.GetData().GetData(), f.peer.done)
			return
		}
		f.fs.relay.sendData(t, pkt, f.peer.done)
		return
	}
	f.fs.relay.onFrontendCloseRequest(t)
}

// gone drops the frontend's pending dials and closes its connections at
// their agents.
func (f *grpcFrontend) gone() {
	f.connMu.Lock()
	var ts []*tunnel
	for _, t := range f.pending {
		ts = append(ts, t)
	}
	for _, t := range f.conns {
		ts = append(ts, t)
	}
	f.connMu.Unlock()
	for _, t := range ts {
		f.fs.relay.closeFromFrontend(t)
	}
	f.fs.log.V(2).Info("Frontend disconnected", "connections", len(ts), "err", f.peer.reason)
}

func (f *grpcFrontend) deliver(pkt *client.Packet, abort <-chan struct{}) {
	if err := f.peer.send(pkt, f.fs.writeTimeout, f.fs.life.quit, abort); errors.Is(err, errSlowFrontend) {
		f.fs.logs.info(f.fs.log, "slow-frontend", "Ended a frontend stream that did not read for too long", "timeout", f.fs.writeTimeout)
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

func (f *grpcFrontend) track(t *tunnel) {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	f.pending[t.random] = t
}

func (f *grpcFrontend) established(t *tunnel) bool {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.conns[t.connectID] != nil {
		return false
	}
	f.conns[t.connectID] = t
	return true
}

func (f *grpcFrontend) forget(t *tunnel) {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.pending[t.random] == t {
		delete(f.pending, t.random)
	}
	if t.connectID != 0 && f.conns[t.connectID] == t {
		delete(f.conns, t.connectID)
	}
}
