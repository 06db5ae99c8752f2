// Package agent is the core of servercount's proxy-agent: a client of the
// Kubernetes apiserver-network-proxy ("Konnectivity") /AgentService/Connect
// protocol that keeps one stream to each proxy-server and serves the
// tunnels the servers ask for.
//
// A [ClientSet] dials the servers' address (usually a load balancer) with
// one gRPC connection per stream, reads each server's serverID and
// serverCount response headers, keeps one stream per distinct serverID and
// aims for a server count that [Config.TargetPolicy] takes from the counts
// the servers send (upstream's way), from a [servercounter.Counter] such as
// a DNS count, or from the larger of the two. On each stream it answers
// DIAL_REQ by dialing the requested endpoint, relays DATA both ways and
// answers CLOSE_REQ, as upstream agents do.
//
// The package does not parse flags, load certificates or serve HTTP: the
// caller builds the gRPC dial options (TLS, keepalive) and mounts
// [ClientSet.Health] on its own server. Metrics are registered on the
// prometheus.Registerer given in [Config].
//
// # Waits, and why none forms a cycle
//
// The design rule, shared with pkg/server: a stream's receive loop never
// blocks on its own peer's send path. It takes no lock the senders hold
// (sendMu), and never calls Send. Its answers (CLOSE_RSP for an unknown
// connectID, refused DIAL_RSP, the CLOSE_RSP of a tunnel it ends) go to
// the stream's control queue, which never waits, drops an answer already
// queued, and is sent by a goroutine of its own; a server that leaves
// maxControl answers unread loses the stream (the CLOSE_RSPs of its own
// tunnels aside: MaxTunnelsPerServer bounds those). A cycle of waits between
// agent and server needs some receive loop to wait for its own peer to
// read; with the rule on both sides none does, so both streams keep
// draining. (Both loops once did, and a stream locked up for good under
// ordinary churn.)
//
// The waits that remain, and why none closes a cycle:
//   - Dial goroutines (DIAL_RSP), tunnel readers (DATA), tunnel writers
//     (WINDOW) and the control goroutine wait for sendMu and in Send for
//     the server's HTTP/2 window. The server's receive loop never waits
//     on the agent, so the window reopens.
//   - With flow control the receive loop queues DATA in the tunnel's
//     queue, which always has room (the server may not send beyond the
//     window), and never waits.
//   - Without flow control (an upstream server, or a window of -1) it
//     waits for room in one tunnel's queue, for at most
//     [Config.EndpointWriteTimeout] in all, then ends that tunnel:
//     upstream's protocol has no other back-pressure. That bounded wait
//     can be part of a chain through an endpoint that reads only after
//     it has written, but the bound breaks it.
//   - Tunnel writers wait for their endpoint, each write bounded by
//     EndpointWriteTimeout.
//
// Liveness backstop: if a cycle nobody foresaw still forms, a stream on
// which nothing has moved for [Config.StreamStallTimeout] while packets
// wait to be sent, or whose receive loop has been inside one packet for
// as long, is ended (logged at level 0, counted in
// servercount_agent_streams_ended_total) and dialled again: it costs
// seconds, not a restart.
//
// # Liveness of servers
//
// A server the agent holds is proven alive within a bound. With
// servercount's servers both ends send HEARTBEAT on a stream idle for
// their interval ([Config.Heartbeat]; the agent answers the server's, see
// wire.HeaderHeartbeat), and a server from which nothing
// arrived for wire.SilenceLimit of its interval is dropped: it stops
// counting as held at once, and the sync loop dials its replacement in
// the same round. Against upstream's servers, which send none, the gRPC
// keepalive of DialOptions is the check. A slow endpoint dial sends a
// HEARTBEAT after wire.DialProgress, so that the server does not take
// the agent for unresponsive.
package agent
