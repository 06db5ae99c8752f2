package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// TestPacketCountsAreCachedBounded counts packets of every known type and
// of thousands of unknown ones, as a hostile peer may send: each lands in
// its series, and the cache of series holds only the known types.
func TestPacketCountsAreCachedBounded(t *testing.T) {
	m := testMetrics(t)
	known := []client.PacketType{client.PacketType_DIAL_REQ, client.PacketType_DATA, wire.PacketHeartbeat}
	for range 3 {
		for _, typ := range known {
			m.packet(segmentFromAgent, typ)
		}
	}
	for typ := range client.PacketType(5000) {
		m.packet(segmentFromAgent, 2000+typ)
	}
	cached := 0
	m.packets.Range(func(any, any) bool { cached++; return true })
	require.Equal(t, len(known), cached, "series cached")

	for _, typ := range known {
		name := wire.PacketTypeName(typ)
		require.Equal(t, 3.0, testutil.ToFloat64(m.streamPackets.WithLabelValues(segmentFromAgent, name)), "packets of type %s", name)
	}
	require.Equal(t, 5000.0, testutil.ToFloat64(m.streamPackets.WithLabelValues(segmentFromAgent, wire.PacketTypeUnknown)), "packets of unknown types")
}
