package balancertest_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/nettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo runs a server that writes back its name and then what it reads,
// and returns its address.
func echo(t *testing.T, name string) string {
	t.Helper()
	return nettest.Serve(t, func(c net.Conn) {
		_, _ = c.Write([]byte(name))
		_, _ = io.Copy(c, c)
	})
}

// greeting dials the balancer and returns the backend's name.
func greeting(t *testing.T, lb *balancertest.Balancer) (net.Conn, string) {
	t.Helper()
	c, err := net.Dial("tcp", lb.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	b := make([]byte, 1)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	return c, string(b)
}

func TestBalancerRelaysToTheBackendsOfTheMoment(t *testing.T) {
	a, b := echo(t, "a"), echo(t, "b")
	lb, err := balancertest.New(a)
	require.NoError(t, err)
	defer lb.Close()

	first, name := greeting(t, lb)
	assert.Equal(t, "a", name)
	lb.SetBackends(b)
	_, name = greeting(t, lb)
	assert.Equal(t, "b", name)

	// The connection made before SetBackends still reaches a.
	_, err = first.Write([]byte("ping"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(first, got)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
}

func TestBalancerWithoutBackendsClosesConnections(t *testing.T) {
	lb, err := balancertest.New()
	require.NoError(t, err)
	defer lb.Close()
	c, err := net.Dial("tcp", lb.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}

// Close cuts relayed connections and aborts a dial to a backend that never
// answers, instead of waiting for it.
func TestBalancerCloseCutsEverything(t *testing.T) {
	lb, err := balancertest.New(echo(t, "a"))
	require.NoError(t, err)
	relayed, _ := greeting(t, lb)

	lb.SetBackends(nettest.Blackhole(t))
	hanging, err := net.Dial("tcp", lb.Addr())
	require.NoError(t, err)
	defer hanging.Close()

	require.NoError(t, lb.Close())
	_, err = relayed.Read(make([]byte, 1))
	assert.Error(t, err)
	_, err = hanging.Read(make([]byte, 1))
	assert.Error(t, err)
}

// Cut ends the relayed connections and keeps accepting: clients connect
// again through the same address.
func TestBalancerCutKeepsAccepting(t *testing.T) {
	lb, err := balancertest.New(echo(t, "a"))
	require.NoError(t, err)
	defer lb.Close()
	relayed, _ := greeting(t, lb)

	lb.Cut()
	_ = relayed.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = relayed.Read(make([]byte, 1))
	assert.Error(t, err, "the relayed connection survived the cut")
	_, name := greeting(t, lb)
	assert.Equal(t, "a", name)
}

// A frozen backend's relays forward nothing, in either direction, and
// close nothing: the client's connection stays open and silent, as
// behind a proxy that froze, until the balancer closes.
func TestFreeze(t *testing.T) {
	a := echo(t, "a")
	lb, err := balancertest.New(a)
	require.NoError(t, err)
	c, name := greeting(t, lb)
	require.Equal(t, "a", name)
	lb.Freeze(a)
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne, "a frozen relay forwarded something, or closed")
	assert.True(t, ne.Timeout(), "a frozen relay forwarded something, or closed: %v", err)

	// A new connection to the frozen backend is frozen from the start.
	c2, err := net.Dial("tcp", lb.Addr())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = c2.Read(make([]byte, 1))
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	require.NoError(t, lb.Close())
}
