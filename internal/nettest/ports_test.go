package nettest

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The ports are distinct, free, and outside the range the kernel hands
// to outgoing connections, where one could be taken before it is bound.
func TestFreePorts(t *testing.T) {
	ports := FreePorts(t, 20)
	seen := map[int]bool{}
	for _, p := range ports {
		assert.False(t, seen[p], "port %d twice", p)
		seen[p] = true
		assert.Less(t, p, ephemeralLow(), "port %d is in the ephemeral range", p)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d is not free", p)
		require.NoError(t, l.Close())
	}
	udp, err := FreeTCPUDPPortOn("127.0.0.1")
	require.NoError(t, err)
	u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(udp)))
	require.NoError(t, err, "UDP port %d is not free", udp)
	require.NoError(t, u.Close())
}
