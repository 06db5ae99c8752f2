// Package dnstest runs an in-process DNS server for tests, benchmarks and
// demos.
//
// A [Server] listens on 127.0.0.1, serving UDP and TCP on the same port, and
// answers from records the test supplies as zone text ([Server.SetZone]) or as
// [dns.RR] values ([Server.SetRecords]). It answers the way an authoritative
// server such as CoreDNS serving a zone does: NOERROR with the records,
// CNAME chains followed within its own data, NODATA and NXDOMAIN with an SOA
// in the authority section, glue for SRV targets, and replies truncated to
// the client's EDNS0 buffer size over UDP. [Headless] builds the records
// Kubernetes DNS serves for a headless Service.
//
// [Server.SetFault] makes the server misbehave in the ways a client must
// survive: SERVFAIL, REFUSED, dropped queries, slow answers, truncation,
// mismatched IDs or questions, and bytes that are not a DNS message.
//
// Every Server has its own handler, never the global [dns.DefaultServeMux],
// so tests that start servers can run in parallel. All methods are safe for
// concurrent use, and records and faults can be changed while queries are
// being answered.
//
// The package does not do recursion, delegation (NS records are served as
// plain data, never as referrals), wildcards, DNSSEC, zone transfers or
// dynamic updates, and it does not check that the records form a valid zone.
package dnstest
