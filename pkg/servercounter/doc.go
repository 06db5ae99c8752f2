// Package servercounter counts the replicas of a service, for clients that
// must hold one connection to each of them, such as the Konnectivity
// proxy-agent, which must reach every proxy-server.
//
// The simple API is [ServerCounter]: CountServers returns a number and never
// fails. Counters that can fail also implement [Counter], whose Count tells a
// valid zero ("no servers") from an unknown count (an error), and reports
// where a count came from.
//
// Four counters compose:
//
//   - [StaticServerCounter] is a fixed number: the upstream --server-count.
//   - [DNSServerCounter] reads the records of a headless Service: distinct SRV
//     targets, or distinct A/AAAA addresses. It follows resolv.conf search
//     rules as a pod's resolver does, retries with back-off, and falls back
//     to TCP when a UDP answer is truncated.
//   - [CachedServerCounter] wraps a Counter: it answers from one atomic load,
//     refreshes in the background once the count expires (one refresh at a
//     time, whatever the number of callers, each expiry jittered), keeps the
//     last good count when a refresh fails and backs off, with jitter,
//     until one succeeds, and answers a static fallback before the first
//     success. [CachedServerCounter.Refresh] asks for a refresh now.
//   - [MaxCounter] takes the largest of several counts, such as DNS and
//     leases while a fleet moves from one to the other.
//
// The package does not open connections to the servers it counts, and knows
// nothing of gRPC, tunnels or Kubernetes objects.
package servercounter
