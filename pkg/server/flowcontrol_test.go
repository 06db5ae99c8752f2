package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversary"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// An agent that turns flow control on and then sends more than the
// server's window for a tunnel whose frontend does not read loses that
// tunnel: the server closes it at the agent (CLOSE_REQ) and at the
// frontend, holds no more than the window for it, and keeps the agent
// stream. FrontendWriteTimeout is an hour: the tunnel must end for its
// overrun, not for a timeout.
func TestAgentOverrunningTheWindowLosesTheTunnel(t *testing.T) {
	t.Parallel()
	const window = 64 << 10
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg, FrontendWriteTimeout: time.Hour, TunnelWindow: window})
	// The test agent offers a window and then sends all it reads,
	// whatever credit it has.
	a := startAgent(t, e, agentOpts{id: "a1", extraMD: []string{wire.HeaderTunnelWindow, strconv.Itoa(window)}})
	waitBackends(t, e, 1)
	established := gaugeOf(t, reg, "konnectivity_network_proxy_server_established_connections", nil)
	queued := gaugeOf(t, reg, "servercount_server_queued_bytes", nil)

	bulk, _ := endlessWriter(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
	defer cancel()
	deaf, err := adversary.DialDeafHTTPClient(ctx, adversary.HTTPClientConfig{Addr: e.connectAddr}, bulk)
	require.NoError(t, err)
	defer deaf.Close()

	select {
	case <-a.closeCh:
	case <-time.After(3 * waitFor):
		t.Fatal("the server did not close the overrun tunnel at the agent")
	}
	_, err = deaf.WaitClosed(ctx)
	require.NoError(t, err, "the server did not close the overrun tunnel's client")
	require.Eventually(t, func() bool { return established() == 0 && queued() == 0 }, waitFor, 5*time.Millisecond,
		"the overrun tunnel is still held (established %v, queued bytes %v)", established(), queued())
	assert.Equal(t, 1, e.srv.Backends(), "the agent stream was dropped")
}
