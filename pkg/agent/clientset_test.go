package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

func TestHandshakeSendsAgentMetadata(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	tokenPath := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenPath, []byte("tok-1\n"), 0o600))

	cfg := testConfig(tt, srv.Addr())
	cfg.AgentID = "agent-7"
	cfg.Identifiers = wire.Identifiers{Host: []string{"node1"}, IPv4: []string{"10.0.0.1"}, DefaultRoute: true}
	cfg.TokenPath = tokenPath
	cfg.SyncForever = true // keep dialing, to see the token re-read
	a := startAgent(t, cfg)

	st := srv.NextStream(t)
	assert.Equal(t, []string{"agent-7"}, st.Metadata().Get(wire.HeaderAgentID))
	assert.Equal(t, []string{"Bearer tok-1"}, st.Metadata().Get(wire.HeaderAuthorization))
	ids := st.Metadata().Get(wire.HeaderAgentIdentifiers)
	require.Len(t, ids, 1)
	got, err := wire.ParseIdentifiers(ids[0])
	require.NoError(t, err)
	assert.Equal(t, cfg.Identifiers, got)
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)

	// The token is read again on every dial.
	require.NoError(t, os.WriteFile(tokenPath, []byte("tok-2"), 0o600))
	deadline := time.Now().Add(waitFor)
	for st := srv.NextStream(t); st.Metadata().Get(wire.HeaderAuthorization)[0] != "Bearer tok-2"; st = srv.NextStream(t) {
		require.True(t, time.Now().Before(deadline), "new token not sent within %v", waitFor)
	}
}

func TestHandshakeWithoutIdentifiersOrToken(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	startAgent(t, testConfig(tt, srv.Addr()))
	st := srv.NextStream(t)
	assert.Empty(t, st.Metadata().Get(wire.HeaderAgentIdentifiers))
	assert.Empty(t, st.Metadata().Get(wire.HeaderAuthorization))
}

func TestHandshakeRejectsBadHeaders(t *testing.T) {
	tests := []struct {
		name string
		opts adversarytest.ServerConfig
	}{
		{name: "no serverID", opts: adversarytest.ServerConfig{OmitID: true, Count: "1"}},
		{name: "empty serverID", opts: adversarytest.ServerConfig{ID: "", Count: "1"}},
		{name: "no serverCount", opts: adversarytest.ServerConfig{ID: "s1", OmitCount: true}},
		{name: "serverCount not a number", opts: adversarytest.ServerConfig{ID: "s1", Count: "three"}},
		{name: "negative serverCount", opts: adversarytest.ServerConfig{ID: "s1", Count: "-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTLS(t)
			srv := newTestServer(t, tt, tc.opts)
			a := startAgent(t, testConfig(tt, srv.Addr()))
			// Each rejected stream is closed by the agent; it retries.
			for range 2 {
				st := srv.NextStream(t)
				require.Eventually(t, st.Ended, waitFor, tick, "rejected stream left open")
			}
			assert.Equal(t, 0, a.Connected())
			assert.False(t, a.Ready())
			// The agent counts a failed dial after closing its stream.
			require.Eventually(t, func() bool {
				n, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "error")
				return n >= 2
			}, waitFor, tick, "two failed dials counted")
		})
	}
}

func TestParseHandshake(t *testing.T) {
	_, _, err := parseHandshake(nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "serverID")
	assert.Contains(t, err.Error(), "serverCount")
}

func TestDuplicateServerIDKeepsOldStream(t *testing.T) {
	tt := newTestTLS(t)
	// The server asks for 2 servers but there is one: every further dial
	// lands on the same serverID.
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "2"})
	a := startAgent(t, testConfig(tt, srv.Addr()))

	first := srv.NextStream(t)
	for range 3 {
		dup := srv.NextStream(t)
		require.Eventually(t, dup.Ended, waitFor, tick, "duplicate stream left open")
	}
	assert.False(t, first.Ended(), "the first stream was closed")
	assert.Equal(t, 1, a.Connected())
	assert.Equal(t, 2, a.Target())
	n, _ := a.metric(t, "servercount_agent_server_dials_total", "result", "duplicate")
	assert.GreaterOrEqual(t, n, 3.0)

	// The kept stream still serves.
	first.Send(t, wire.CloseReq(77))
	assert.Equal(t, int64(77), first.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse().GetConnectID())
}

func TestReachesTargetThroughLoadBalancer(t *testing.T) {
	tests := []struct {
		name    string
		counter int
		policy  TargetPolicy
		count   string
	}{
		{name: "count received from servers", counter: 1, policy: TargetReceived, count: "3"},
		{name: "count from the counter", counter: 3, policy: TargetCounted, count: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTLS(t)
			s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: tc.count})
			s2 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s2", Count: tc.count})
			s3 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s3", Count: tc.count})
			lb := newTestLB(t, s1.Addr(), s2.Addr(), s3.Addr())
			cfg := testConfig(tt, lb.Addr())
			cfg.Counter = servercounter.StaticServerCounter(tc.counter)
			cfg.TargetPolicy = tc.policy
			a := startAgent(t, cfg)

			require.Eventually(t, func() bool { return a.Connected() == 3 }, waitFor, tick)
			assert.Equal(t, 3, a.Target())
			v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_server_connections")
			assert.Equal(t, 3.0, v)
			v, _ = a.metric(t, "konnectivity_network_proxy_agent_known_server_count")
			assert.Equal(t, 3.0, v)

			// A server goes away.
			lb.SetBackends(s1.Addr(), s3.Addr())
			s2.Stop()
			require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick)

			// A fresh one comes up.
			s4 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s4", Count: tc.count})
			lb.SetBackends(s1.Addr(), s3.Addr(), s4.Addr())
			require.Eventually(t, func() bool { return a.Connected() == 3 }, waitFor, tick)
			s4.NextStream(t)
		})
	}
}

func TestNoChurnWhenTargetReached(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	a := startAgent(t, testConfig(tt, srv.Addr()))
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
	opened := srv.Opened()

	a.waitSyncRounds(t, 30)
	assert.Equal(t, opened, srv.Opened(), "Connect streams opened with the target reached")
	assert.Equal(t, 1, a.Connected())
}

func TestSyncForeverKeepsDialing(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	cfg := testConfig(tt, srv.Addr())
	cfg.SyncForever = true
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
	opened := srv.Opened()
	require.Eventually(t, func() bool { return srv.Opened() >= opened+3 }, waitFor, tick)
	assert.Equal(t, 1, a.Connected())
}

func TestDrain(t *testing.T) {
	tt := newTestTLS(t)
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "2"})
	s2 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s2", Count: "2"})
	lb := newTestLB(t, s1.Addr(), s2.Addr())
	target := newTestTarget(t, true)
	a := startAgent(t, testConfig(tt, lb.Addr()))
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick)
	// The stream each server kept; duplicates end at once. The target is
	// reached, so no dial is in flight.
	live := func(s *adversarytest.HostileServer) *adversarytest.ServerStream {
		all := s.TakeStreams()
		var l *adversarytest.ServerStream
		require.Eventually(t, func() bool {
			n := 0
			for _, st := range all {
				if !st.Ended() {
					n, l = n+1, st
				}
			}
			return n == 1
		}, waitFor, tick)
		return l
	}
	st1, st2 := live(s1), live(s2)

	a.Drain(t.Context())
	a.Drain(t.Context()) // once only
	st1.NextOf(t, pb.PacketType_DRAIN)
	st2.NextOf(t, pb.PacketType_DRAIN)

	// No new server connections: one server leaves, the agent stays at 1.
	lb.SetBackends(s1.Addr())
	s2.Stop()
	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
	opened := s1.Opened()
	a.waitSyncRounds(t, 30)
	assert.Equal(t, opened, s1.Opened(), "dialed while draining")
	assert.Equal(t, 1, a.Connected())

	// Tunnels still work, new ones included, and no second DRAIN came.
	id := st1.DialOK(t, target.addr, 1)
	st1.Send(t, wire.Data(id, []byte("ping")))
	d := st1.NextOf(t, pb.PacketType_DATA).GetData()
	assert.Equal(t, "ping", string(d.GetData()))
}

func TestHealth(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	lb := newTestLB(t) // no backend yet
	a := newAgent(t, testConfig(tt, lb.Addr()))
	hs := httptest.NewServer(a.Health())
	t.Cleanup(hs.Close)

	assert.Equal(t, http.StatusServiceUnavailable, proctest.Status(hs.URL+"/healthz"), "healthz before Run")
	assert.Equal(t, http.StatusServiceUnavailable, proctest.Status(hs.URL+"/readyz"))
	assert.Equal(t, http.StatusServiceUnavailable, proctest.Status(hs.URL+"/ready"))
	assert.Equal(t, http.StatusNotFound, proctest.Status(hs.URL+"/other"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool { return proctest.Status(hs.URL+"/healthz") == http.StatusOK }, waitFor, tick)
	a.waitSyncRounds(t, 3)
	assert.Equal(t, http.StatusServiceUnavailable, proctest.Status(hs.URL+"/readyz"), "ready with no server")

	lb.SetBackends(srv.Addr())
	require.Eventually(t, func() bool { return proctest.Status(hs.URL+"/readyz") == http.StatusOK }, waitFor, tick)
	assert.True(t, a.Ready())

	lb.SetBackends()
	srv.Stop()
	require.Eventually(t, func() bool { return proctest.Status(hs.URL+"/readyz") == http.StatusServiceUnavailable }, waitFor, tick)

	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, http.StatusServiceUnavailable, proctest.Status(hs.URL+"/healthz"), "healthz after Run")
	require.ErrorContains(t, a.Run(t.Context()), "twice")
}

func TestRunClosesEverything(t *testing.T) {
	// Runs last (cleanups are LIFO): after servers, targets and agent.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	target := newTestTarget(t, false)
	a, st := oneStream(t)
	id := st.DialOK(t, target.addr, 1)
	conn := target.accepted(t)
	st.DialOK(t, target.addr, 2)
	_ = target.accepted(t)
	st.Send(t, wire.Data(id, []byte("x")))
	buf := make([]byte, 1)
	_, err := conn.Read(buf)
	require.NoError(t, err)

	a.stop()
	assert.Equal(t, 0, a.Connected())
	require.Eventually(t, st.Ended, waitFor, tick)
	// The endpoint connection was closed.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err = conn.Read(buf)
	require.Error(t, err)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	v, _ := a.metric(t, "konnectivity_network_proxy_agent_open_endpoint_connections")
	assert.Equal(t, 0.0, v)
}
