package server

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/servercount/servercount/pkg/clock"
	grpcpeer "google.golang.org/grpc/peer"
)

func fromAddr(ip string) context.Context {
	return grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

// Handshakes of an address with refused tokens of late each take one of
// its bucket as they start: with one left, one is checked and the others
// refused, however many come at once; one whose token is accepted gives
// it back, one whose token is refused spends it.
func TestRefusedBucketIsTakenAtEntry(t *testing.T) {
	h := &handshakes{perAddress: 16, clock: clock.Real{}}
	ctx := fromAddr("10.0.0.7")
	h.refused = map[netip.Prefix]*refusedBucket{peerPrefix(ctx): {lim: rate.NewLimiter(0, 1)}} // one left, none to come

	leave, err := h.enter(ctx)
	require.NoError(t, err)
	for range 15 {
		_, err := h.enter(ctx)
		require.ErrorIs(t, err, errTooManyRefused)
	}
	leave(false) // accepted: the check is given back
	leave, err = h.enter(ctx)
	require.NoError(t, err)
	leave(true) // refused: spent
	_, err = h.enter(ctx)
	require.ErrorIs(t, err, errTooManyRefused)

	// Another address is not held back; its first refusal starts its own
	// bucket.
	other := fromAddr("10.0.0.8")
	leave, err = h.enter(other)
	require.NoError(t, err)
	leave(true)
	require.InDelta(t, float64(refusedBurst-1), h.refused[peerPrefix(other)].lim.Tokens(), 0.5)
	require.Zero(t, h.n)
	require.Empty(t, h.byAddr)
}

// At maxRefusingAddrs, a new address's first refusal forgets another:
// the map stays bounded and the new one is counted.
func TestRefusingAddressesAreBounded(t *testing.T) {
	h := &handshakes{perAddress: 16, clock: clock.Real{}}
	for i := range maxRefusingAddrs + 10 {
		ctx := fromAddr(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).String())
		leave, err := h.enter(ctx)
		require.NoError(t, err)
		leave(true)
		require.NotNil(t, h.refused[peerPrefix(ctx)], "address %d counted", i)
	}
	require.Len(t, h.refused, maxRefusingAddrs)
}
