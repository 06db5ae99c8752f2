// Package adversarytest holds hostile peers of servercount's proxy-server and
// proxy-agent, as reusable test doubles. Each speaks the real wire
// protocol over a real socket and misbehaves in one named way, as peers
// that once found defects in the binaries did:
//
//   - [DeafAgent]: an agent that completes the /AgentService/Connect
//     handshake and then reads only when the test makes it;
//   - [DeafFrontend]: a /ProxyService/Proxy client that opens tunnels and
//     then reads only when the test makes it;
//   - [DeafHTTPClient]: an HTTP CONNECT client that never reads what the
//     tunnel sends it;
//   - [HostileServer]: a proxy-server's agent port that answers the
//     handshake with the headers it is told to (an absurd serverCount, a
//     new serverID per stream) and sends whatever packets the test makes
//     it send, DIAL_REQ floods included;
//   - [LyingDNS]: a DNS server that claims absurd record counts or flaps
//     between answers, on top of the faults of [dnstest.Server];
//   - [EncodePackets] and [DecodePackets]: a byte form of packet sequences,
//     for fuzz inputs and captured streams.
//
// A double does nothing on its own that the test did not ask for: deaf
// peers start no goroutine that reads. Every double is bounded: by the
// context it was dialled with, by its Close method, and by the test's
// cleanup where it takes a [testing.TB]; none leaves a goroutine behind
// once closed, so the packages that use them keep goleak's check.
//
// The package imports pkg/wire and the Konnectivity packet types only,
// never pkg/server or pkg/agent, so that the tests of both can use it.
// It listens and dials on loopback only.
package adversarytest
