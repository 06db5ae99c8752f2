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
package agent
