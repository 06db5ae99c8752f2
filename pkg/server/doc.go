// Package server is the core of servercount's Konnectivity-compatible
// proxy-server: it accepts proxy-agents on /AgentService/Connect, accepts
// frontends (kube-apiserver's egress selector, the konnectivity-client Go
// package, any HTTP CONNECT client) on /ProxyService/Proxy and over HTTP
// CONNECT, picks an agent for each dial by the configured strategies, and
// relays the tunnel's packets between the two sides.
//
// The count of proxy-servers that agents should connect to is read from a
// [servercounter.ServerCounter] on every agent handshake and sent in the
// serverCount response header, so it can change while the server runs.
//
// The package does not listen, parse flags or load certificates: the
// caller owns the gRPC servers (and their TLS credentials, which check
// client certificates), the HTTP servers and the signal handling, and
// registers a [Server] on them:
//
//	srv, err := server.New(server.Config{ServerID: id, Counter: counter})
//	wire.RegisterAgentServiceServer(agentGRPC, srv)
//	client.RegisterProxyServiceServer(frontendGRPC, srv)
//	http.Serve(connectListener, srv.HTTPConnect())
//	http.Serve(healthListener, srv.Health())
//	...
//	srv.Close()
//
// A Server is safe for concurrent use.
//
// # Waits, and why none forms a cycle
//
// The design rule: a receive loop never blocks on its own peer's send
// path. It takes no lock a writer holds while sending, never waits for
// room in its own stream's queue and never calls Send. A cycle of waits
// between two processes needs some receive loop to wait, directly or
// through other goroutines, for its own peer to read; the rule cuts every
// such chain at the receive loop, which keeps reading, so every stream
// keeps draining. (A stream once locked up for good under ordinary
// churn when both receive loops waited on their own peer.)
//
// Every gRPC stream has at most one writer goroutine, the only caller of
// Send, which runs while packets wait and ends when none do, so that an
// idle stream holds none. It serves two queues. The data queue is
// bounded in packets (queueSize, each at most wire.MaxDataPayload), and
// senders may wait for room in it. The control queue carries what
// receive loops answer (CLOSE_REQ for a connection the server has
// forgotten or refused, CLOSE_RSP for an unknown connectID, DIAL_RSP
// errors); queueing there never waits. A control packet goes after the
// data queued before it and before the data queued after it, so a
// CLOSE_REQ never overtakes its connection's last DATA nor a DIAL_RSP its
// first, and it is dropped when the same answer is queued already. A peer
// that leaves maxControl of them unread loses its stream, counting only
// those no tunnel of the stream accounts for: those about its own tunnels
// and dials have a bound of their own (maxTunnelControl), far above the
// tunnels a stream holds, so that closing them all at once over a slow
// link keeps it.
//
// The waits that remain, and why none closes a cycle:
//   - A frontend's receive loop (a gRPC frontend stream, or an HTTP
//     CONNECT client's reader) waits for room in an agent stream's data
//     queue: back-pressure on that frontend. The agent's writer waits
//     only for the agent to read, and an agent's receive loop never waits
//     on its server (pkg/agent keeps the same rule), so the queue drains.
//     The wait ends with the frontend, the agent stream or the Server.
//   - The same loop, for a flow-controlled tunnel, never waits for the
//     agent's credit: data without credit goes to the tunnel's outbox,
//     sent by a goroutine of the tunnel's own. Only when one tunnel has a
//     window's worth in its outbox too does the loop wait for room there,
//     and for at most [Config.FrontendWriteTimeout]; then that tunnel
//     alone is ended. (Not waiting at all would need unbounded buffers or
//     dropped data: a frontend stream has one HTTP/2 window for all its
//     tunnels.)
//   - An agent stream's receive loop hands an agent's DATA to a
//     frontend. With flow control it queues it in the tunnel's queue,
//     which always has room (the agent may not send beyond the window),
//     and never waits. Without (an upstream agent, or a window of -1) it
//     waits for room in the frontend's queue for at most
//     FrontendWriteTimeout, then ends that frontend: upstream's protocol
//     has no other back-pressure. That bounded wait can be part of a
//     chain through a frontend that reads only after it has written, but
//     the bound breaks it.
//   - pump (per flow-controlled tunnel) waits for its frontend, bounded
//     as above, and for room for WINDOW in the agent's data queue, which
//     drains as above.
//   - Writers wait in Send for their peer's HTTP/2 window, and nothing
//     else waits on a writer but a full queue's senders, none of them a
//     receive loop of the same stream.
//   - An agent stream's receive loop hands DIAL_RSP and CLOSE_RSP to a
//     frontend with frontend.answer, which never waits: a gRPC
//     frontend's control queue. One frontend with a full queue therefore
//     never holds up another frontend's dial on the same agent stream.
//     Its waits for room for DATA (without flow control) end with the
//     agent stream too.
//
// Liveness backstop: if a cycle nobody foresaw still forms, an agent
// stream on which nothing has moved for [Config.StreamStallTimeout] while
// packets wait to be sent, or whose receive loop has been inside one
// packet for as long, is ended (logged at level 0, counted in
// servercount_server_streams_ended_total), and its agent dials again: it
// costs seconds, not a restart.
//
// # Liveness of agents
//
// Every agent stream the server routes to is proven alive within a
// bound. With servercount's agents both ends send HEARTBEAT on a stream
// idle for their interval ([Config.Heartbeat]; the agent answers the
// server's, see wire.HeaderHeartbeat), and a stream from which nothing
// arrived for wire.SilenceLimit of the agent's interval is ended: a stopped
// process, a black hole or a frozen relay costs seconds. Upstream's
// agents send none; the gRPC keepalive the caller sets covers them. An
// agent whose transport lives but which answers no dial is taken for
// unresponsive ([Config.UnansweredDialTimeout]): its dials go to other
// agents and it gets new ones only when nobody else can take them. One
// goroutine (sweep.go) checks every agent stream, whatever their number,
// each when one of its checks could act.
//
// # Flow control
//
// Every gRPC stream has at most one writer goroutine at a time, fed by a
// bounded queue, so sends on a stream are serialised and no lock is held
// while sending.
// Packets from a frontend to an agent wait for room in the agent's queue
// (back-pressure on that frontend only), but never past the frontend's
// own end: a frontend that goes away is freed at once, and its CLOSE_REQs
// are queued behind what the agent has yet to read without waiting for
// room. Packets from an agent to a
// frontend wait at most [Config.FrontendWriteTimeout] for room in the
// frontend's queue; a frontend that stays full for that long is torn down
// (a gRPC frontend stream is ended, an HTTP CONNECT connection is closed,
// and CLOSE_REQ goes to the agent for each of its connections). One slow
// frontend can therefore delay the other tunnels of the same agent stream
// for at most that long, and can never deadlock it.
package server
