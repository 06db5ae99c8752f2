package server_test

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/pkg/server"
)

// With destHost, the first agent to claim a host holds it while it is
// connected, as upstream's server has it: impostors that claim node-a's
// name and address after node-a's agent, with made-up agent IDs, get none
// of its dials, and each claim is counted. Once node-a's agent leaves,
// the next claimant gets them.
func TestLaterClaimantsOfAHostGetNoneOfItsDials(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := startEnv(t, server.Config{Registerer: reg, Strategies: []server.Strategy{server.StrategyDestHost, server.StrategyDefault}})
	const claim = "host=node-a&ipv4=10.0.0.5"
	nodeA := startAgent(t, e, agentOpts{id: "node-a", identifiers: claim})
	waitBackends(t, e, 1)
	impostors := make([]*testAgent, 9)
	for i := range impostors {
		impostors[i] = startAgent(t, e, agentOpts{id: fmt.Sprintf("impostor-%d", i), identifiers: claim})
		waitBackends(t, e, 2+i) // one by one: their age order is known
	}

	// The addresses are not loopback: the test agent refuses the dial
	// without trying; what counts is which agent was asked.
	for i := range 200 {
		addr := "10.0.0.5:10250"
		if i%2 == 1 {
			addr = "NODE-A:10250" // names compare without case
		}
		require.Equal(t, "test agent dials only loopback addresses", rawDial(t, e, addr))
	}
	assert.Equal(t, int64(200), nodeA.dials.Load(), "dials node-a's agent got")
	for i, a := range impostors {
		assert.Zero(t, a.dials.Load(), "dials impostor %d got", i)
	}
	assert.Equal(t, 18.0, gaugeOf(reg, "servercount_server_contested_identifier_claims_total", nil)(), "contested claims: 9 agents, 2 identifiers each")

	nodeA.stop()
	waitBackends(t, e, 9)
	require.Equal(t, "test agent dials only loopback addresses", rawDial(t, e, "10.0.0.5:10250"))
	assert.Equal(t, int64(1), impostors[0].dials.Load(), "the next claimant in age order holds node-a once it left")
}

// An agent may claim at most MaxAgentIdentifiers identifiers, each no
// longer than a DNS name: each costs the server an index entry for as
// long as the stream lasts.
func TestIdentifierBounds(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{Strategies: []server.Strategy{server.StrategyDestHost}})
	many := make([]string, server.MaxAgentIdentifiers+1)
	for i := range many {
		many[i] = fmt.Sprintf("ipv4=10.0.%d.%d", i/256, i%256)
	}
	for _, tc := range []struct{ name, ids, want string }{
		{name: "too many", ids: strings.Join(many, "&"), want: "65 agent identifiers, more than the 64 a server takes"},
		{name: "too long", ids: "host=" + strings.Repeat("a", 254), want: "an agent identifier of 254 bytes, longer than a DNS name (253)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := connectAgent(t, e, agentOpts{id: tc.name, identifiers: tc.ids})
			if err == nil {
				_, err = a.Recv()
			}
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tc.want)
		})
	}
	// At the bound, the agent is served.
	startAgent(t, e, agentOpts{id: "at-bound", identifiers: strings.Join(many[:server.MaxAgentIdentifiers], "&")})
	waitBackends(t, e, 1)
}

// With BindIdentifiers and mTLS, an agent may claim only the names and
// addresses in its certificate's SANs: node-a's agent, claiming node-b's
// name and address as well, gets node-a's dials and none of node-b's,
// and the dropped claims are counted.
func TestBoundIdentifiersFromCertificateSANs(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := startEnv(t, server.Config{Registerer: reg, BindIdentifiers: true, Strategies: []server.Strategy{server.StrategyDestHost}})
	pair, err := e.ca.Client("node-a-agent", "node-a", "10.0.0.5", "fd00::5")
	require.NoError(t, err)
	tlsA := e.agentTLS.Clone()
	tlsA.Certificates = []tls.Certificate{pair.TLS}
	da, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: e.agentAddr, TLS: tlsA, ID: "node-a",
		Identifiers: "host=NODE-A&ipv4=10.0.0.5&ipv6=fd00:0::5&host=node-b&ipv4=10.0.0.6&ipv6=fd00::6"})
	require.NoError(t, err)
	t.Cleanup(da.Close)
	a := serveDeafAgent(t, da, nil)
	waitBackends(t, e, 1)

	for _, addr := range []string{"node-a:10250", "10.0.0.5:10250", "[fd00::5]:10250"} {
		assert.Equal(t, "test agent dials only loopback addresses", rawDial(t, e, addr), "dial to %s", addr)
	}
	for _, addr := range []string{"node-b:10250", "10.0.0.6:10250", "[fd00::6]:10250"} {
		assert.Equal(t, "No agent available", rawDial(t, e, addr), "dial to %s", addr)
	}
	assert.Equal(t, int64(3), a.dials.Load())
	assert.Equal(t, 3.0, gaugeOf(reg, "servercount_server_unbound_identifier_claims_total", nil)())

	// The env's own client certificate has no SAN: it proves nothing.
	b := startAgent(t, e, agentOpts{id: "no-sans", identifiers: "host=node-c"})
	waitBackends(t, e, 2)
	assert.Equal(t, "No agent available", rawDial(t, e, "node-c:10250"))
	assert.Zero(t, b.dials.Load())
	assert.Equal(t, 4.0, gaugeOf(reg, "servercount_server_unbound_identifier_claims_total", nil)())
}

// Without BindIdentifiers, claims are taken as sent, as upstream takes
// them; and binding needs credentials that can prove a node.
func TestBindIdentifiersNeedsAnIdentifyingCredential(t *testing.T) {
	t.Parallel()
	_, err := server.New(server.Config{ServerID: "s1", BindIdentifiers: true, Authenticator: tokenFileAuth(t, "good\n")})
	require.ErrorContains(t, err, "a token file proves no node")
}
