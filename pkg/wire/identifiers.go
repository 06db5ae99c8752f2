package wire

import (
	"fmt"
	"net/url"
	"strconv"
)

// Identifiers are what an agent says of itself in the agentIdentifiers
// header, so that a server can pick it for a destination (the destHost
// and defaultRoute strategies).
type Identifiers struct {
	IPv4, IPv6, Host, CIDR []string
	// DefaultRoute says the agent can reach any destination.
	DefaultRoute bool
}

// Identifier keys in the header's URL-query encoding.
const (
	identIPv4         = "ipv4"
	identIPv6         = "ipv6"
	identHost         = "host"
	identCIDR         = "cidr"
	identDefaultRoute = "default-route"
)

// ParseIdentifiers parses the agentIdentifiers header, or the
// --agent-identifiers flag: URL-query encoded, e.g.
// "ipv4=10.0.0.1&host=node1&default-route=true". Unknown keys are ignored,
// as upstream ignores them.
func ParseIdentifiers(s string) (Identifiers, error) {
	var id Identifiers
	q, err := url.ParseQuery(s)
	if err != nil {
		return id, fmt.Errorf("invalid agent identifiers %q: want URL-query form such as ipv4=10.0.0.1&host=node1: %w", s, err)
	}
	id.IPv4, id.IPv6, id.Host, id.CIDR = q[identIPv4], q[identIPv6], q[identHost], q[identCIDR]
	for _, v := range q[identDefaultRoute] {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return id, fmt.Errorf("invalid agent identifier default-route=%q: want true or false", v)
		}
		id.DefaultRoute = id.DefaultRoute || b
	}
	return id, nil
}

// String encodes id for the agentIdentifiers header.
func (id Identifiers) String() string {
	q := url.Values{}
	for k, vs := range map[string][]string{identIPv4: id.IPv4, identIPv6: id.IPv6, identHost: id.Host, identCIDR: id.CIDR} {
		for _, v := range vs {
			q.Add(k, v)
		}
	}
	if id.DefaultRoute {
		q.Set(identDefaultRoute, "true")
	}
	return q.Encode()
}
