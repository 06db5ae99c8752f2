package proxytest

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
)

// The first fault, in one process: one of two servers freezes
// behind an L4 relay (the sockets stay open, nothing is forwarded) while
// its replacement comes up behind the balancertest. Both ends drop the dead
// stream within the silence of their heartbeats, the agent holds the
// replacement, and requests flow through both servers it holds. Before
// heartbeats, the agent held the frozen server for an hour and the
// replacement had no agent.
func TestFrozenServerIsDroppedAtBothEndsAndReplaced(t *testing.T) {
	// Long enough that a loaded machine does not make s2 look silent.
	const heartbeat = 500 * time.Millisecond
	env := NewEnv(t, "frozen")
	target := nettest.StartTarget(t, Echo).Addr()
	opts := func(id string) ServerOptions {
		return ServerOptions{ID: id, Heartbeat: heartbeat, Count: servercounter.StaticServerCounter(2)}
	}
	s1, s2, s3 := StartServer(t, env, opts("s1")), StartServer(t, env, opts("s2")), StartServer(t, env, opts("s3"))
	lb, err := balancertest.New(s1.AgentAddr(), s2.AgentAddr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = lb.Close() })
	cfg := FastAgentConfig("a1", lb.Addr())
	cfg.Heartbeat, cfg.TargetPolicy = heartbeat, agent.TargetReceived
	a := StartAgent(t, env, cfg)
	require.Eventually(t, func() bool { return s1.Core().Backends() == 1 && s2.Core().Backends() == 1 }, StopTimeout, 10*time.Millisecond)

	lb.SetBackends(s2.AgentAddr(), s3.AgentAddr())
	lb.Freeze(s1.AgentAddr())
	require.Eventually(t, func() bool {
		return s1.Core().Backends() == 0 && s3.Core().Backends() == 1 && a.ClientSet().Connected() == 2
	}, StopTimeout, 10*time.Millisecond, "the frozen server was not dropped at both ends and replaced")
	silent, _ := metricstest.Value(a.Registry(), "servercount_agent_streams_ended_total", "reason", "silent")
	assert.Equal(t, 1.0, silent)
	silent, _ = metricstest.Value(s1.Registry(), "servercount_server_streams_ended_total", "reason", "silent")
	assert.Equal(t, 1.0, silent)
	for _, s := range []*Server{s2, s3} {
		c, err := s.DialHTTPConnect(t.Context(), target)
		require.NoError(t, err, "through %s", s.ID())
		_, err = c.Write([]byte("ping"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = io.ReadFull(c, b)
		require.NoError(t, err, "through %s", s.ID())
		assert.Equal(t, "ping", string(b))
		c.Close()
	}
}
