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
// # Flow control
//
// Every gRPC stream has one writer goroutine fed by a bounded queue, so
// sends on a stream are serialised and no lock is held while sending.
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
