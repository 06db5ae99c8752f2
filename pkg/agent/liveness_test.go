package agent

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// testHeartbeat is the heartbeat interval of these tests: a silent server
// is dead after wire.SilenceLimit of it.
const testHeartbeat = 40 * time.Millisecond

// heartbeatServer starts a hostile server named id that answers the
// agent's heartbeat offer with interval, and then sends only what the
// test makes it send.
func heartbeatServer(t *testing.T, tt testTLS, id string, interval time.Duration) *adversarytest.HostileServer {
	t.Helper()
	return newTestServer(t, tt, adversarytest.ServerConfig{ID: id, Count: "1", Metadata: []string{wire.HeaderHeartbeat, wire.FormatHeartbeat(interval)}})
}

// A server that took up heartbeats and then sends nothing (a frozen
// process, a black hole, a relay that forwards nothing: the transport
// looks fine) is dropped within wire.SilenceLimit of its interval, logged
// at level 0 and counted; it stops counting as held at once, and the
// agent dials again. Meanwhile the agent sent its own heartbeats.
func TestSilentServerIsDroppedAndDialledAgain(t *testing.T) {
	tt := newTestTLS(t)
	srv := heartbeatServer(t, tt, "s1", testHeartbeat)
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat = testHeartbeat
	a, logs := runLogged(t, cfg)

	ss := srv.NextStream(t)
	assert.Equal(t, []string{wire.FormatHeartbeat(testHeartbeat)}, ss.Metadata().Get(wire.HeaderHeartbeat), "the agent did not offer heartbeats")
	require.Equal(t, wire.PacketHeartbeat, ss.Next(t).GetType(), "the agent sent no heartbeat on an idle stream")
	<-ss.Done() // the agent dropped it
	require.Eventually(t, func() bool { return srv.Opened() >= 2 }, waitFor, tick, "the agent did not dial again")
	v, _ := a.metric(t, "servercount_agent_streams_ended_total", "reason", "silent")
	assert.GreaterOrEqual(t, v, 1.0)
	assert.Contains(t, logs.String(), "Dropped a proxy-server that sent nothing, not even a heartbeat, for too long")
}

// A server that sends heartbeats keeps its stream however long it is
// idle. The interval leaves a loaded machine room: the server answers
// each of the agent's heartbeats, which come 1.5 intervals apart, and
// silence is two and a half.
func TestHeartbeatingServerIsKept(t *testing.T) {
	const heartbeat = 250 * time.Millisecond
	tt := newTestTLS(t)
	srv := heartbeatServer(t, tt, "s1", heartbeat)
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat = heartbeat
	a := startAgent(t, cfg)
	ss := srv.NextStream(t)

	// Twelve of the agent's heartbeats, answered by the server's: seven
	// silences' worth.
	for n := 0; n < 12; {
		if p := ss.Next(t); p.GetType() == wire.PacketHeartbeat {
			n++
			ss.Send(t, wire.Heartbeat())
		}
	}
	assert.EqualValues(t, 1, srv.Opened(), "a server that sends heartbeats was dropped")
	assert.Equal(t, 1, a.Connected())
}

// The agent answers a server's heartbeat at once when it has sent
// nothing for half its own interval, and not when it has sent since: an
// idle stream's heartbeats then go in rounds the server starts (its sweep
// sends them in bursts), and a server's heartbeats never make the agent
// send more than two an interval. The agent's own heartbeats (after 1.5
// intervals idle) are off here, its probe loop waiting an hour: every
// heartbeat seen is an answer. A CLOSE_REQ for an unknown connection
// marks where each answer would be: the agent answers it with CLOSE_RSP,
// after anything queued before.
func TestServerHeartbeatIsAnsweredWhenIdle(t *testing.T) {
	// Half of it is the test's margin for a loaded machine in the
	// second round.
	const heartbeat = 4 * time.Second
	tt := newTestTLS(t)
	srv := heartbeatServer(t, tt, "s1", heartbeat)
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat, cfg.ProbeInterval = heartbeat, time.Hour
	startAgent(t, cfg)
	ss := srv.NextStream(t)
	// The agent has sent nothing since its handshake, which is over; its
	// stream starts a moment later. Three quarters of the interval leave
	// it a second.
	idleSince := time.Now()

	<-time.After(time.Until(idleSince.Add(heartbeat * 3 / 4)))
	ss.Send(t, wire.Heartbeat())
	ss.Send(t, wire.CloseReq(1))
	require.Equal(t, wire.PacketHeartbeat, ss.Next(t).GetType(), "a heartbeat after half an interval idle went unanswered")
	require.Equal(t, pb.PacketType_CLOSE_RSP, ss.Next(t).GetType())

	ss.Send(t, wire.Heartbeat())
	ss.Send(t, wire.CloseReq(2))
	require.Equal(t, pb.PacketType_CLOSE_RSP, ss.Next(t).GetType(), "a heartbeat was answered though the agent had just sent")
}

// An agent whose server sends no heartbeat (its interval is an hour)
// sends its own 1.5 intervals apart, not one: a server of the same
// interval then sends its next first, and the agent answers it. Arrival
// times are compared with a quarter interval to spare for delays in
// transit.
func TestOwnHeartbeatsComeOneAndAHalfIntervalsApart(t *testing.T) {
	const heartbeat = time.Second
	tt := newTestTLS(t)
	srv := heartbeatServer(t, tt, "s1", time.Hour)
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat = heartbeat
	startAgent(t, cfg)
	ss := srv.NextStream(t)
	ss.NextOf(t, wire.PacketHeartbeat)
	at := time.Now()
	ss.NextOf(t, wire.PacketHeartbeat)
	assert.GreaterOrEqual(t, time.Since(at), heartbeat*5/4, "the agent's own heartbeats came less than 1.5 intervals apart")
}

// probePeriod checks a stream at least four times per heartbeat interval,
// so that a long ProbeInterval does not stretch the gap between the
// agent's heartbeats past the server's silence limit.
func TestProbePeriodFollowsTheHeartbeat(t *testing.T) {
	for _, c := range []struct{ probe, heartbeat, want time.Duration }{
		{time.Second, 5 * time.Second, time.Second},
		{7 * time.Second, 5 * time.Second, 1250 * time.Millisecond},
		{7 * time.Second, -1, 7 * time.Second},
	} {
		assert.Equal(t, c.want, Config{ProbeInterval: c.probe, Heartbeat: c.heartbeat}.probePeriod(), "probe %v, heartbeat %v", c.probe, c.heartbeat)
	}
}

// A server that does not take up heartbeats (upstream's) gets none and is
// not held to them: it stays, silent, through many silences' worth of
// sync rounds, and a HEARTBEAT it sends is not answered.
func TestServerWithoutHeartbeatsIsNotHeldToThem(t *testing.T) {
	tt := newTestTLS(t)
	srv := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "1"})
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat = testHeartbeat
	a := startAgent(t, cfg)
	ss := srv.NextStream(t)
	a.waitSyncRounds(t, float64(5*wire.Silence(testHeartbeat)/cfg.SyncInterval))
	assert.EqualValues(t, 1, srv.Opened())
	select {
	case p := <-ss.Packets():
		t.Fatalf("the agent sent %v to a server that did not take up heartbeats", wire.PacketTypeName(p.GetType()))
	default:
	}
	// Nor does it answer one such a server sends anyway: the CLOSE_RSP
	// for an unknown connection comes first.
	ss.Send(t, wire.Heartbeat())
	ss.Send(t, wire.CloseReq(1))
	assert.Equal(t, pb.PacketType_CLOSE_RSP, ss.Next(t).GetType(), "the agent answered a heartbeat on a stream without heartbeats")
}

// When one of two servers goes silent while a tunnel is open on it, the
// agent drops it, keeps the other, and dials the replacement (here the
// same server on a new stream, which takes the dropped stream's place: a
// stream given up on is not a duplicate).
func TestSilentServerIsReplaced(t *testing.T) {
	tt := newTestTLS(t)
	// Intervals that leave a loaded machine room to keep s2.
	const heartbeat = 250 * time.Millisecond
	s1, s2 := heartbeatServer(t, tt, "s1", heartbeat), heartbeatServer(t, tt, "s2", heartbeat)
	counter, _ := dnsCounter(t, s1.Addr(), s2.Addr())
	cfg := testConfig(tt, "127.0.0.1:1") // the load balancer is never needed
	cfg.DialMode, cfg.TargetPolicy = DialResolved, TargetCounted
	cfg.Counter = counter
	cfg.Heartbeat = heartbeat
	a := startAgent(t, cfg)

	// s2 keeps its stream alive; s1's first stream holds a tunnel whose
	// target the test keeps open, and goes silent.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		ss := s2.NextStream(t)
		for {
			select {
			case <-stop:
				return
			case p := <-ss.Packets():
				if p.GetType() == wire.PacketHeartbeat {
					_ = ss.SendPacket(wire.Heartbeat())
				}
			}
		}
	}()
	target := newTestTarget(t, false)
	first := s1.NextStream(t)
	first.Send(t, wire.DialReq("tcp", target.addr, 1))
	conn := target.accepted(t)
	defer conn.Close()
	for first.Next(t).GetType() != pb.PacketType_DIAL_RSP {
	}

	<-first.Done()
	second := s1.NextStream(t)
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick, "the new stream to s1 was not kept")
	second.End()
}

// get returns the status and body of GET url, or 0 when it fails.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// With ReadyWhenAll, /readyz is 503 once a counted server has been
// missing for longer than the grace period, and 200 again once every
// counted server is held; ?verbose says what is counted, held and
// dialled. Without it, one server is enough, as upstream's.
func TestReadinessWhenAllServers(t *testing.T) {
	tt := newTestTLS(t)
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "2"})
	s2 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s2", Count: "2"})
	lb := newTestLB(t) // s2's address, which answers nothing at first
	counter, _ := dnsCounter(t, s1.Addr(), lb.Addr())
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy, cfg.Counter = DialResolved, TargetCounted, counter
	cfg.ReadyWhenAll, cfg.ReadinessGracePeriod = true, 200*time.Millisecond
	a := startAgent(t, cfg)
	hs := httptest.NewServer(a.Health())
	defer hs.Close()

	require.Eventually(t, func() bool { return a.Connected() == 1 }, waitFor, tick)
	require.Eventually(t, func() bool { code, _ := get(hs.URL + "/readyz"); return code == http.StatusServiceUnavailable },
		waitFor, tick, "/readyz passed with a counted server missing past the grace")
	_, body := get(hs.URL + "/readyz?verbose")
	assert.Contains(t, body, "counted: 2 proxy-servers (dns)")
	assert.Contains(t, body, "held: 1, serving on 1: s1")
	assert.Contains(t, body, "readiness: every counted server, after 200ms")
	v, _ := a.metric(t, "servercount_agent_ready")
	assert.Equal(t, 0.0, v)

	lb.SetBackends(s2.Addr())
	require.Eventually(t, func() bool { code, _ := get(hs.URL + "/readyz"); return code == http.StatusOK },
		waitFor, tick, "/readyz failed with every counted server held")
	_, body = get(hs.URL + "/readyz?verbose")
	assert.Contains(t, body, "held: 2, serving on 2: s1, s2")
	v, _ = a.metric(t, "servercount_agent_ready")
	assert.Equal(t, 1.0, v)
}

// By default readiness is upstream's: one server held is ready, however
// many are counted.
func TestReadinessIsUpstreamsByDefault(t *testing.T) {
	tt := newTestTLS(t)
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "2"})
	counter, _ := dnsCounter(t, s1.Addr(), nettest.Refused(t, "127.0.0.1"))
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy, cfg.Counter = DialResolved, TargetCounted, counter
	a := startAgent(t, cfg)
	hs := httptest.NewServer(a.Health())
	defer hs.Close()
	require.Eventually(t, func() bool { return a.Connected() == 1 && a.Readiness().MissingFor > 0 }, waitFor, tick)
	code, body := get(hs.URL + "/readyz?verbose")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "readiness: one server (upstream's)")
}

// When a server the agent held goes away, the agent asks its
// count again at once, rather than when the count expires: a replacement
// listed at a new address is held within seconds though the records'
// TTL is an hour.
func TestLostServerIsReResolved(t *testing.T) {
	tt := newTestTLS(t)
	s1 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s1", Count: "2"})
	s2 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s2", Count: "2"})
	s3 := newTestServer(t, tt, adversarytest.ServerConfig{ID: "s3", Count: "2"})
	dns := dnstest.NewServer(t)
	publish := func(addrs ...string) {
		rrs := dnstest.SRVRecords(srvName, addrs...)
		for _, rr := range rrs {
			rr.Header().Ttl = 3600
		}
		dns.SetRecords(rrs...)
	}
	publish(s1.Addr(), s2.Addr())
	dc, err := servercounter.NewDNSServerCounter(servercounter.Config{Name: srvName, Servers: []string{dns.Addr()}})
	require.NoError(t, err)
	cache, err := servercounter.NewCachedServerCounter(dc, servercounter.CacheConfig{MinExpiry: 100 * time.Millisecond, MaxExpiry: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cache.Close() })
	cfg := testConfig(tt, "127.0.0.1:1")
	cfg.DialMode, cfg.TargetPolicy, cfg.Counter = DialResolved, TargetCounted, cache
	a := startAgent(t, cfg)
	require.Eventually(t, func() bool { return a.Connected() == 2 }, waitFor, tick)

	publish(s2.Addr(), s3.Addr()) // the replacement's record
	s1.Stop()                     // the server goes away
	lost := time.Now()
	require.Eventually(t, func() bool { return s3.Opened() >= 1 && a.Connected() == 2 }, waitFor, tick,
		"the replacement was not dialled: the agent waits for an hour's TTL")
	// The bound: a replacement dialled within 2 s of its record
	// (here, a tenth of that: one MinExpiry and a sync round).
	assert.Less(t, time.Since(lost), 2*time.Second, "the replacement was dialled late")
}

// A dial to an endpoint that does not answer shows the server, within
// wire.DialProgress, that the agent read it: a HEARTBEAT that carries
// the dial's random, which the server counts where it does not count a
// plain one (a deaf agent still sends those).
func TestSlowDialShowsItsProgress(t *testing.T) {
	tt := newTestTLS(t)
	// An interval far above DialProgress: the heartbeat that comes is the
	// dial's, not the idle stream's.
	srv := heartbeatServer(t, tt, "s1", time.Minute)
	cfg := testConfig(tt, srv.Addr())
	cfg.Heartbeat = time.Minute
	startAgent(t, cfg)
	ss := srv.NextStream(t)
	ss.Send(t, wire.DialReq("tcp", nettest.Blackhole(t), 42))
	p := ss.NextOf(t, wire.PacketHeartbeat)
	random, ok := wire.DialProgressOf(p)
	require.True(t, ok, "a plain HEARTBEAT, not the dial's progress")
	require.Equal(t, int64(42), random)
}
