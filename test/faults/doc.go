// Package faults is the fault matrix: the faults that make a
// proxy-agent hold a server that is gone or a proxy-server route to an
// agent that cannot answer, made to happen to the binaries as processes,
// ours asserted and upstream's measured side by side.
//
// Its tests run with `make faults` (go test ./test/faults -faults),
// as root: servers that must be cut off live in network namespaces of
// their own, joined to the test's by a veth pair, and a black hole is a
// pair of blackhole routes. The faults:
//
//   - a server frozen behind an L4 relay (sockets open, nothing forwarded);
//   - a server black-holed (no FIN, no RST, nothing);
//   - a partition between an agent and a server that heals;
//   - an agent stopped with SIGSTOP;
//   - an agent whose transport answers pings but which answers no dial;
//   - a server stopped with SIGSTOP and replaced at a new address, with
//     DNS counting in both dial modes;
//   - an agent killed while a dial waits on it.
//
// With -faults.out the table of what each pairing did is written in
// Markdown; docs/benchmarks.md quotes it.
package faults
