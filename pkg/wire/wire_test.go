package wire_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/wire"
)

func TestIdentifiersRoundTrip(t *testing.T) {
	t.Parallel()
	id, err := wire.ParseIdentifiers("ipv4=10.0.0.1&ipv4=10.0.0.2&ipv6=fd00::1&host=node1&cidr=10.0.0.0/24&default-route=true&color=blue")
	require.NoError(t, err)
	assert.Equal(t, wire.Identifiers{
		IPv4: []string{"10.0.0.1", "10.0.0.2"}, IPv6: []string{"fd00::1"}, Host: []string{"node1"},
		CIDR: []string{"10.0.0.0/24"}, DefaultRoute: true,
	}, id)
	again, err := wire.ParseIdentifiers(id.String())
	require.NoError(t, err)
	assert.Equal(t, id, again)
}

func TestParseIdentifiersRejectsBadInput(t *testing.T) {
	t.Parallel()
	_, err := wire.ParseIdentifiers("default-route=perhaps")
	assert.ErrorContains(t, err, `invalid agent identifier default-route="perhaps": want true or false`)
	_, err = wire.ParseIdentifiers("ipv4=%zz")
	assert.ErrorContains(t, err, "invalid agent identifiers")
	id, err := wire.ParseIdentifiers("")
	require.NoError(t, err)
	assert.Equal(t, wire.Identifiers{}, id)
}
