// Package fleet runs a fleet of proxy-agents against a few proxy-servers in
// one process, to measure how the fleet behaves as a whole: how fast every
// agent reaches its servers, what that costs in Connect streams, TLS
// handshakes, DNS queries and TokenReviews, and what an idle agent stream
// costs in memory and goroutines.
//
// A [Fleet] is N real agents (pkg/agent, each with its own client
// certificate, token file and DNS counter, built as cmd/proxy-agent builds
// them from --server-count-dns with the binary's default sync settings)
// and M real proxy-servers (pkg/server through internal/proxytest, each
// authenticating agents through internal/tokenreview's cache against a
// TokenReview endpoint of the harness), over loopback TLS. The servers'
// headless name is served by the in-process DNS server of
// internal/dnstest, and a random load balancer (internal/proxytest) sits
// in front of them. Agents dial either the balancer (agent.DialLoadBalancer)
// or each address DNS lists (agent.DialResolved). The harness scales the
// servers through DNS, replaces them one by one, waits for conditions on
// every agent, and counts.
//
// The package's test checks that a small fleet converges and that the
// counters count; `make test` runs it. The figures come from its
// benchmarks, which `make bench-fleet` runs once each with 1000 agents:
//
//	make bench-fleet
//	make bench-fleet BENCH_FLEET_FLAGS='-fleet.agents=100 -fleet.steady=10s'
//
// or directly:
//
//	go test -run '^$' -bench . -benchtime 1x -count 1 -timeout 30m ./test/fleet/ -fleet.agents=1000
//
// Each figure is a b.ReportMetric: seconds until the last agent holds its
// servers after a cold start (both dial modes), after a scale-up and a
// scale-down through DNS and through a rolling replacement; Connect
// streams, DNS queries and TokenReviews per agent or per second; the
// largest number of DNS queries in any 100 ms against the average; and
// heap and goroutines per agent stream on the server side and per idle
// agent. Everything runs in one process on loopback, so the figures
// include the scheduling of N agents and M servers on the machine's
// cores: they are upper bounds for a real fleet spread over nodes.
//
// Limits of one machine: every agent stream is a socket at each end, and
// two more in the balancer in LB mode, so 1000 agents behind the balancer
// need 12000 open files (the balancer copies through a buffer: with
// io.Copy's splice(2) it would hold a pipe per direction, 24 files per
// agent, as an early run here did). The benchmarks raise the
// soft limit to the hard one (and the hard one too when they may), and
// in LB mode run as many agents as fit, saying so. BenchmarkScale
// runs in resolved mode only, as 5 servers behind the balancer would
// need 20 sockets per agent. TLS handshakes at both ends are the largest
// share of a cold start's CPU, so on a shared 2-core machine the cold
// start measures the machine as much as the agents; BenchmarkSteady
// measures its DNS bursts against reference timers in the same window
// for that reason.
//
// BenchmarkAgentProcess runs one proxy-agent binary as a process against
// the fleet's servers and reports its resident memory (VmRSS) and
// goroutines; BenchmarkServerProcess runs one proxy-server binary as a
// process with the fleet's agents connected and reports what each agent
// stream costs it. The package does not measure tunnels' throughput (see
// test/tunnelbench).
package fleet
