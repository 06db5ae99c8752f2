package server

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/servercount/servercount/pkg/wire"
)

// What an agent claims (its agentIdentifiers), in the form routes finds
// streams by, and the bounds on the claims of one stream.

// hostKey is the form in which a host identifier, or the host of a dial's
// address, is looked up: an address by value (an IPv4-mapped IPv6 address
// is its IPv4 address), a name without case.
func hostKey(host string) string {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
	}
	return strings.ToLower(host)
}

// Bounds on what an agent claims: a node has a name and a few addresses,
// and each claim costs the server an entry in routes for as long as the
// stream lasts.
const (
	// MaxAgentIdentifiers bounds the host, ipv4, ipv6 and cidr values of
	// one agent stream's agentIdentifiers.
	MaxAgentIdentifiers = 64
	// maxIdentifierLen bounds one value: a DNS name's length.
	maxIdentifierLen = 253
)

// checkIdentifierBounds refuses identifiers beyond MaxAgentIdentifiers or
// maxIdentifierLen.
func checkIdentifierBounds(ids wire.Identifiers) error {
	n := 0
	for _, list := range [][]string{ids.Host, ids.IPv4, ids.IPv6, ids.CIDR} {
		n += len(list)
		for _, v := range list {
			if len(v) > maxIdentifierLen {
				return fmt.Errorf("an agent identifier of %d bytes, longer than a DNS name (%d): give the node's name and addresses", len(v), maxIdentifierLen)
			}
		}
	}
	if n > MaxAgentIdentifiers {
		return fmt.Errorf("%d agent identifiers, more than the %d a server takes: give the node's name and addresses", n, MaxAgentIdentifiers)
	}
	return nil
}

// hostKeys returns the hostKeys of ids' host, ipv4 and ipv6 identifiers,
// each once. An ipv4 or ipv6 value that is no address matches no dial, as
// before: it is left out.
func hostKeys(ids wire.Identifiers) []string {
	var keys []string
	add := func(k string) {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, h := range ids.Host {
		add(hostKey(h))
	}
	for _, list := range [][]string{ids.IPv4, ids.IPv6} {
		for _, v := range list {
			if a, err := netip.ParseAddr(v); err == nil {
				add(a.Unmap().String())
			}
		}
	}
	return keys
}

// dialHostKey is the hostKey of the host in a dial's address.
func dialHostKey(address string) string {
	if h, _, err := net.SplitHostPort(address); err == nil {
		return hostKey(h)
	}
	return hostKey(address)
}
