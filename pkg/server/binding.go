package server

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/servercount/servercount/pkg/wire"
)

// Identity is what an agent's credential proves about where it runs: the
// host names and addresses it may claim in its agentIdentifiers when
// Config.BindIdentifiers is set.
type Identity struct {
	// Hosts are host names: a node's name and the DNS names of its
	// addresses, or a certificate's DNS SANs. They compare without case.
	Hosts []string
	// Addrs are addresses: a node's, or a certificate's IP SANs.
	Addrs []netip.Addr
}

// TokenIdentifier is a [TokenAuthenticator] that also says whose a token
// is. With Config.BindIdentifiers and token authentication, the server
// calls IdentifyToken in place of AuthenticateToken.
type TokenIdentifier interface {
	TokenAuthenticator
	// IdentifyToken authenticates token as AuthenticateToken does and
	// returns the identity it proves; a token that proves no node gives
	// the zero Identity, which allows no claim.
	IdentifyToken(ctx context.Context, token string) (Identity, error)
}

// String lists id for logs, as agentIdentifiers would.
func (id Identity) String() string {
	ids := wire.Identifiers{Host: id.Hosts}
	for _, a := range id.Addrs {
		if a.Is4() {
			ids.IPv4 = append(ids.IPv4, a.String())
		} else {
			ids.IPv6 = append(ids.IPv6, a.String())
		}
	}
	return ids.String()
}

// errCannotIdentify refuses BindIdentifiers with an authenticator that
// proves nothing of where an agent runs.
var errCannotIdentify = errors.New("binding agent identifiers needs credentials that say where an agent runs: service-account tokens bound to pods (--agent-namespace), or client certificates; a token file proves no node")

// certIdentity is what the verified client certificate of ctx's peer
// proves: its DNS and IP SANs. ok is false without one.
func certIdentity(ctx context.Context) (id Identity, ok bool) {
	p, found := grpcpeer.FromContext(ctx)
	if !found {
		return Identity{}, false
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return Identity{}, false
	}
	cert := info.State.PeerCertificates[0]
	id.Hosts = slices.Clone(cert.DNSNames)
	for _, ip := range cert.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			id.Addrs = append(id.Addrs, a.Unmap())
		}
	}
	return id, true
}

// bind keeps of ids the host, ipv4 and ipv6 claims that id proves, and
// returns the claims it dropped. Other claims (cidr, default-route) name
// no host of the agent's own and are kept.
func (id Identity) bind(ids wire.Identifiers) (wire.Identifiers, []string) {
	var dropped []string
	hosts := make([]string, len(id.Hosts))
	for i, h := range id.Hosts {
		hosts[i] = hostKey(h)
	}
	proven := func(v string) bool {
		if a, err := netip.ParseAddr(v); err == nil {
			return slices.Contains(id.Addrs, a.Unmap())
		}
		return slices.Contains(hosts, strings.ToLower(v))
	}
	keep := func(kind string, list []string) []string {
		var out []string
		for _, v := range list {
			if proven(v) {
				out = append(out, v)
			} else {
				dropped = append(dropped, kind+"="+v)
			}
		}
		return out
	}
	ids.Host = keep("host", ids.Host)
	ids.IPv4 = keep("ipv4", ids.IPv4)
	ids.IPv6 = keep("ipv6", ids.IPv6)
	return ids, dropped
}
