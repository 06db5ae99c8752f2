package agent

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/pkitest"
)

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// tick is the polling period of require.Eventually.
const tick = 5 * time.Millisecond

// testTLS holds one CA's server and client credentials.
type testTLS struct {
	server credentials.TransportCredentials
	client grpc.DialOption
}

func newTestTLS(t testing.TB) testTLS {
	t.Helper()
	ca, err := pkitest.NewCA("agent-test-ca")
	require.NoError(t, err)
	srv, err := ca.Server("proxy-server")
	require.NoError(t, err)
	cli, err := ca.Client("proxy-agent")
	require.NoError(t, err)
	return testTLS{
		server: credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{srv.TLS},
			ClientCAs:    ca.Pool(),
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS13,
		}),
		client: grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cli.TLS},
			RootCAs:      ca.Pool(),
			MinVersion:   tls.VersionTLS13,
		})),
	}
}

// newTestServer starts a hostile proxy-server (see adversarytest.HostileServer)
// with tt's server credentials: it answers the handshake as cfg says and
// hands each Connect stream to the test.
func newTestServer(t testing.TB, tt testTLS, cfg adversarytest.ServerConfig) *adversarytest.HostileServer {
	t.Helper()
	cfg.Creds = tt.server
	return adversarytest.StartHostileServer(t, cfg)
}

// newTestServerOn is newTestServer on a listener of the test's choosing.
func newTestServerOn(t testing.TB, tt testTLS, cfg adversarytest.ServerConfig, lis net.Listener) *adversarytest.HostileServer {
	t.Helper()
	cfg.Listener = lis
	return newTestServer(t, tt, cfg)
}

// newTestLB starts a load balancer in front of backends, closed when the
// test ends.
func newTestLB(t testing.TB, backends ...string) *balancertest.Balancer {
	t.Helper()
	lb, err := balancertest.New(backends...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lb.Close() }) // the error is the listener's
	return lb
}

// testTarget is an endpoint for tunnels. It hands accepted connections to
// the test, or echoes them when echo is set.
type testTarget struct {
	addr  string
	lis   net.Listener
	echo  bool
	conns chan net.Conn
	mu    sync.Mutex
	open  []net.Conn
	wg    sync.WaitGroup
}

func newTestTarget(t testing.TB, echo bool) *testTarget {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tg := &testTarget{addr: lis.Addr().String(), lis: lis, echo: echo, conns: make(chan net.Conn, 1024)}
	tg.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tg.mu.Lock()
			tg.open = append(tg.open, c)
			tg.mu.Unlock()
			if tg.echo {
				tg.wg.Go(func() { _, _ = io.Copy(c, c); _ = c.Close() })
			} else {
				tg.conns <- c
			}
		}
	})
	t.Cleanup(func() {
		_ = lis.Close()
		tg.mu.Lock()
		for _, c := range tg.open {
			_ = c.Close()
		}
		tg.mu.Unlock()
		tg.wg.Wait()
	})
	return tg
}

// accepted returns the next connection the target accepted.
func (tg *testTarget) accepted(t testing.TB) net.Conn {
	t.Helper()
	select {
	case c := <-tg.conns:
		return c
	case <-time.After(waitFor):
		t.Fatalf("target accepted no connection within %v", waitFor)
		return nil
	}
}

// testConfig is a Config for tests: short intervals, TLS.
func testConfig(tt testTLS, addr string) Config {
	cfg := DefaultConfig()
	cfg.AgentID = "agent-1"
	cfg.ServerAddress = addr
	cfg.DialOptions = []grpc.DialOption{tt.client}
	cfg.SyncInterval = 10 * time.Millisecond
	cfg.SyncIntervalCap = 50 * time.Millisecond
	cfg.ProbeInterval = 10 * time.Millisecond
	cfg.DialTimeout = 2 * time.Second
	cfg.HandshakeTimeout = 5 * time.Second
	return cfg
}

// testAgent is a running ClientSet and its metrics.
type testAgent struct {
	*ClientSet
	reg  *prometheus.Registry
	stop func()
}

// startAgent builds a ClientSet from cfg and runs it until the test ends
// or stop is called; stop waits for Run to return.
func startAgent(t testing.TB, cfg Config) *testAgent {
	t.Helper()
	a := newAgent(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(waitFor):
				t.Errorf("Run did not return within %v of cancel", waitFor)
			}
		})
	}
	t.Cleanup(a.stop)
	require.Eventually(t, a.running.Load, waitFor, tick)
	return a
}

// newAgent builds a ClientSet from cfg with a private registry.
func newAgent(t testing.TB, cfg Config) *testAgent {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	cs, err := NewClientSet(cfg)
	require.NoError(t, err)
	return &testAgent{ClientSet: cs, reg: reg}
}

// metric returns the value of the series name{labels}, and whether it
// exists.
func (a *testAgent) metric(t testing.TB, name string, labels ...string) (float64, bool) {
	t.Helper()
	return metricstest.Value(a.reg, name, labels...)
}

// syncRounds returns the number of sync rounds so far.
func (a *testAgent) syncRounds(t testing.TB) float64 {
	t.Helper()
	v, _ := a.metric(t, "servercount_agent_sync_rounds_total")
	return v
}

// waitSyncRounds waits until n more sync rounds have run.
func (a *testAgent) waitSyncRounds(t testing.TB, n float64) {
	t.Helper()
	start := a.syncRounds(t)
	require.Eventually(t, func() bool { return a.syncRounds(t) >= start+n }, waitFor, tick)
}
