// Package counting owns how the binaries count proxy-servers: the
// count-source flags, their validation, and the counters built from them,
// with the cap, the fallback, the metrics and the outage logs. It
// replaces what were two packages, one per source. It does not import the
// agent core, so that the probe and the proxy-server do not link it.
//
// The count's path, from flag to dial decision, is four files:
//
//  1. here, agent.go: --server-count-dns (dns.go), --count-server-leases
//     (leases.go) and --server-count-max, which bounds them all, become
//     one counter that notifies its changes (AgentOptions.Build); the
//     name and nameservers are checked by servercounter.Config.Validate,
//     its errors renamed to the flags; the proxy-agent's
//     options turn --server-count-source and AgentOptions.Counts into
//     the agent's policy; the proxy-server's count is DNSOptions.Build's,
//     or its --server-count;
//  2. pkg/servercounter's cache.go: a DNS count is cached, refreshed in
//     the background, kept through failures and capped (a lease count is
//     pkg/lease's Counter, kept by an informer);
//  3. pkg/agent's target.go: the policy weighs the count against the
//     counts servers report, the hold-down delays a decrease, the cap
//     applies again to received counts;
//  4. pkg/agent's sync.go: with fewer streams than the target, dial.
//
// The server side also publishes leases (PublishOptions), which other
// agents count.
package counting
