// Package clockstep holds the test that steps this machine's wall clock
// under a running proxy-server and proxy-agent: NTP after a VM resumes,
// or a clock set by hand. Only the monotonic clock may measure the
// liveness of a peer. It sets the wall clock (as root), so it runs alone:
// `make clock-step`, part of `make ci`, and never in `make test`.
package clockstep

import (
	"context"
	"flag"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
)

var step = flag.Bool("clock.step", false, "run TestWallClockSteps, which sets this machine's wall clock (root; make clock-step)")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// heartbeat is the pair's interval: a silent peer is dropped after 2.5
// of them.
const heartbeat = time.Second

// A step of the wall clock, an hour forward and then an hour back, ends
// no stream of a running pair and blinds no check: each half still
// drops a peer that stops (SIGSTOP) within the silence limit. Before the
// liveness times were monotonic (2026-12-07), a forward step of more than
// 12.5 s ended every agent stream of a server, and a backward one blinded
// the checks for its length.
func TestWallClockSteps(t *testing.T) {
	if !*step {
		t.Skip("sets this machine's wall clock: make clock-step (as root)")
	}
	server, agent := startPair(t)
	ended := func(p pairProc) float64 {
		m, err := proctest.Scrape(p.metrics)
		require.NoError(t, err)
		return m.Sum(p.endedMetric)
	}
	heartbeats := func(p pairProc) float64 {
		m, err := proctest.Scrape(p.metrics)
		require.NoError(t, err)
		return m.Sum(p.packetsMetric, "packet_type", "HEARTBEAT")
	}
	// Several heartbeats each way: the stream is up and idle.
	waitHeartbeats := func(n float64) {
		t.Helper()
		s0, a0 := heartbeats(server), heartbeats(agent)
		require.Eventually(t, func() bool {
			return heartbeats(server) >= s0+n && heartbeats(agent) >= a0+n
		}, 30*time.Second, 50*time.Millisecond, "heartbeats stopped")
	}
	waitHeartbeats(3)

	clk := wallClock{t: t}
	t.Cleanup(clk.restore)
	for _, d := range []time.Duration{time.Hour, -time.Hour} {
		clk.step(d)
		// Over three silence limits, as the checks see time.
		waitHeartbeats(8)
		assert.Zero(t, ended(server), "streams the server ended after a step of %v", d)
		assert.Zero(t, ended(agent), "streams the agent ended after a step of %v", d)
		assert.Equal(t, 1.0, connected(t, agent), "servers the agent holds after a step of %v", d)
	}

	// The checks still see: a stopped server is dropped by the agent
	// within the silence limit (2.5 s) and a margin for a loaded machine.
	require.NoError(t, server.proc.Signal(syscall.SIGSTOP))
	defer func() { _ = server.proc.Signal(syscall.SIGCONT) }()
	require.Eventually(t, func() bool { return ended(agent) >= 1 }, 10*heartbeat, 50*time.Millisecond, "the agent kept a stopped server")
	require.NoError(t, server.proc.Signal(syscall.SIGCONT))
	// And a stopped agent by the server.
	require.Eventually(t, func() bool { return connected(t, agent) == 1 }, 30*time.Second, 50*time.Millisecond, "the agent did not connect again")
	before := ended(server)
	require.NoError(t, agent.proc.Signal(syscall.SIGSTOP))
	defer func() { _ = agent.proc.Signal(syscall.SIGCONT) }()
	require.Eventually(t, func() bool { return ended(server) > before }, 10*heartbeat, 50*time.Millisecond, "the server kept a stopped agent")
}

// wallClock steps CLOCK_REALTIME, and puts back what its steps added
// up to when the test ends, whatever happens, so that the machine ends
// where it started (less the moments the steps take).
type wallClock struct {
	t      *testing.T
	offset time.Duration
}

func (w *wallClock) step(d time.Duration) {
	w.t.Helper()
	require.NoError(w.t, setWallClock(d), "set the wall clock (needs root)")
	w.offset += d
	w.t.Logf("stepped the wall clock by %v: it reads %v", d, time.Now().Round(0).UTC())
}

func (w *wallClock) restore() {
	if w.offset != 0 {
		if err := setWallClock(-w.offset); err != nil {
			w.t.Errorf("put the wall clock back by %v: %v", -w.offset, err)
		}
	}
}

// setWallClock moves CLOCK_REALTIME by d.
func setWallClock(d time.Duration) error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return err
	}
	next := unix.NsecToTimespec(ts.Nano() + int64(d))
	return unix.ClockSettime(unix.CLOCK_REALTIME, &next)
}

// pairProc is one half of the pair, with where its metrics are and the
// names it counts ended streams and packets under.
type pairProc struct {
	proc                       *proctest.Process
	metrics                    string
	endedMetric, packetsMetric string
}

// connected is how many servers the agent holds.
func connected(t *testing.T, agent pairProc) float64 {
	m, err := proctest.Scrape(agent.metrics)
	require.NoError(t, err)
	v, _ := m.Value("konnectivity_network_proxy_agent_open_server_connections")
	return v
}

// startPair starts our proxy-server and proxy-agent with heartbeats every
// second, over mTLS on loopback, and waits until the agent holds the
// server.
func startPair(t *testing.T) (server, agent pairProc) {
	_, c := pkitest.TempFiles(t, "clockstep-ca")
	ports := nettest.FreePorts(t, 6)
	port := func(i int) string { return strconv.Itoa(ports[i]) }
	hb := "--heartbeat-interval=" + heartbeat.String()
	serverFlags := proctest.ServerFlags{Mode: "grpc", FrontendPort: ports[0], AgentPort: ports[1], HealthPort: ports[2], AdminPort: ports[3],
		Cert: c.ServerCert, Key: c.ServerKey, CA: c.CA}
	server.proc = proctest.Start(t, proctest.Build(t, "cmd/proxy-server"), serverFlags.Args("-v=0", hb)...)
	server.metrics = "http://127.0.0.1:" + port(2) + "/metrics"
	server.endedMetric, server.packetsMetric = "servercount_server_streams_ended_total", "konnectivity_network_proxy_server_stream_packets_total"
	agentFlags := proctest.AgentFlags{ID: "clockstep", ServerPort: ports[1], CA: c.CA, Cert: c.AgentCert, Key: c.AgentKey, HealthPort: ports[4], AdminPort: ports[5]}
	agent.proc = proctest.Start(t, proctest.Build(t, "cmd/proxy-agent"), agentFlags.Args("-v=0", hb)...)
	agent.metrics = "http://127.0.0.1:" + port(5) + "/metrics"
	agent.endedMetric, agent.packetsMetric = "servercount_agent_streams_ended_total", "konnectivity_network_proxy_agent_stream_packets_total"
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for proctest.Status("http://127.0.0.1:"+port(4)+"/readyz") != http.StatusOK {
		select {
		case <-ctx.Done():
			t.Fatalf("the agent never held the server\nproxy-server:\n%s\nproxy-agent:\n%s", server.proc.Output(), agent.proc.Output())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return server, agent
}
