package adversarytest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// AgentConfig says how a [DeafAgent] reaches a proxy-server and what it
// sends in its handshake.
type AgentConfig struct {
	// Addr is the proxy-server's agent port, host:port. It is dialled only
	// when Conn is nil.
	Addr string
	// TLS is the agent's client-side TLS configuration for Addr; nil means
	// plaintext.
	TLS *tls.Config
	// Conn, if set, carries the stream instead of a connection of the
	// agent's own; the caller keeps it open for as long as the agent runs
	// and closes it. Fuzz targets reuse one connection for every input.
	Conn grpc.ClientConnInterface
	// ID is the agentID header; empty leaves the header out.
	ID string
	// Identifiers is the agentIdentifiers header; empty leaves it out.
	Identifiers string
	// Token is sent as "Bearer <Token>" in the authorization header;
	// empty leaves it out.
	Token string
	// Metadata are more handshake headers, as key, value pairs.
	Metadata []string
}

// DeafAgent is an agent on /AgentService/Connect that has completed its
// handshake and reads nothing unless the test calls [DeafAgent.Recv] (or
// [DeafAgent.AcceptDial]): a proxy-server's packets to it stay in gRPC's
// windows and the server's queue, as they did for an agent that never
// read. Sends are serialised, so several goroutines may send.
//
// A DeafAgent starts no goroutine of its own; [DeafAgent.Close] ends its
// stream and frees everything it holds.
type DeafAgent struct {
	deafStream
	header metadata.MD
}

// DialDeafAgent connects an agent to a proxy-server and waits for the
// server's response headers. A refused handshake (the server answers with
// trailers only) is returned as the gRPC status error the server sent.
// The stream lives until ctx is done or Close is called.
func DialDeafAgent(ctx context.Context, cfg AgentConfig) (*DeafAgent, error) {
	a := &DeafAgent{}
	// The windows an agent sets (see server.GRPCServerOptions), so that
	// what stays unread is bounded by the server's queues, not by the
	// default 64 KiB window.
	conn, err := a.connect(cfg.Conn, cfg.Addr, cfg.TLS,
		grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow))
	if err != nil {
		return nil, fmt.Errorf("adversary: agent connection to %s: %w", cfg.Addr, err)
	}
	var kv []string
	if cfg.ID != "" {
		kv = append(kv, wire.HeaderAgentID, cfg.ID)
	}
	if cfg.Identifiers != "" {
		kv = append(kv, wire.HeaderAgentIdentifiers, cfg.Identifiers)
	}
	if cfg.Token != "" {
		kv = append(kv, wire.HeaderAuthorization, "Bearer "+cfg.Token)
	}
	kv = append(kv, cfg.Metadata...)
	ctx, a.cancel = context.WithCancel(metadata.AppendToOutgoingContext(ctx, kv...))

	stream, err := wire.Connect(ctx, conn)
	if err == nil {
		a.stream = stream
		a.header, err = stream.Header()
	}
	if err == nil && len(a.header) == 0 {
		// Trailers only: the server refused the stream; Recv returns
		// its status.
		_, err = stream.Recv()
		if err == nil {
			err = errors.New("adversary: the server sent a packet without response headers")
		}
	}
	if err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// Header returns the server's response headers (serverID, serverCount).
func (a *DeafAgent) Header() metadata.MD { return a.header }

// RecvN reads the server's next n packets and then stops reading: the
// agent that hears a little and then goes deaf.
func (a *DeafAgent) RecvN(n int) ([]*client.Packet, error) {
	pkts := make([]*client.Packet, 0, n)
	for range n {
		p, err := a.Recv()
		if err != nil {
			return pkts, err
		}
		pkts = append(pkts, p)
	}
	return pkts, nil
}

// AcceptDial reads packets until a DIAL_REQ, answers it with a
// successful DIAL_RSP carrying connectID, and returns the request. The
// packets before it are dropped. The agent is deaf again afterwards.
func (a *DeafAgent) AcceptDial(connectID int64) (*client.DialRequest, error) {
	for {
		p, err := a.Recv()
		if err != nil {
			return nil, fmt.Errorf("adversary: waiting for a DIAL_REQ: %w", err)
		}
		if p.GetType() != client.PacketType_DIAL_REQ {
			continue
		}
		req := p.GetDialRequest()
		if err := a.Send(wire.DialRsp(req.GetRandom(), connectID, "")); err != nil {
			return nil, fmt.Errorf("adversary: answering DIAL_REQ for %s: %w", req.GetAddress(), err)
		}
		return req, nil
	}
}
