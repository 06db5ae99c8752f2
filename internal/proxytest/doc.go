// Package proxytest runs proxy-servers, proxy-agents and HTTP targets
// in-process over loopback sockets, for integration tests, benchmarks and
// the demo; internal/balancertest is the load balancer in front of them.
package proxytest
