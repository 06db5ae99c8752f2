package proxytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/servercounter"
)

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// tick is the polling period of require.Eventually.
const tick = 5 * time.Millisecond

// Metric names read by the tests.
const (
	metricEstablished    = "konnectivity_network_proxy_server_established_connections"
	metricPendingDials   = "konnectivity_network_proxy_server_pending_backend_dials"
	metricRejections     = "servercount_server_agent_rejections_total"
	metricAgentDials     = "servercount_agent_server_dials_total"
	metricAgentEndpoints = "konnectivity_network_proxy_agent_open_endpoint_connections"
)

// frontendMode is one way for a client to reach the proxy-server.
type frontendMode struct {
	name string
	dial func(s *Server) DialFunc
}

var frontendModes = []frontendMode{
	{name: "grpc", dial: func(s *Server) DialFunc { return s.DialGRPC }},
	{name: "http-connect", dial: func(s *Server) DialFunc { return s.DialHTTPConnect }},
}

// fixture is one server with one agent connected to it.
type fixture struct {
	env   *Env
	srv   *Server
	agent *Agent
}

// startFixture starts a server with opts and an agent "agent-1" for it,
// and waits until the agent is connected. edit, if not nil, changes the
// agent's configuration first.
func startFixture(t *testing.T, opts ServerOptions, edit func(*agent.Config)) fixture {
	t.Helper()
	env := NewEnv(t, "proxytest-ca")
	srv := StartServer(t, env, opts)
	cfg := FastAgentConfig("agent-1", srv.AgentAddr())
	if edit != nil {
		edit(&cfg)
	}
	ag := StartAgent(t, env, cfg)
	require.Eventually(t, srv.Core().Ready, waitFor, tick, "agent never connected")
	return fixture{env: env, srv: srv, agent: ag}
}

// metric returns the value of the gauge or counter name in reg whose
// labels include labels, or -1 if there is none.
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := metricstest.Value(reg, name, labels...)
	if !ok {
		return -1
	}
	return v
}

// within runs f and fails the test if it does not return within d. f keeps
// running after a failure; it must end when the test ends (reads on
// tunnels do: the tunnels close).
func within(t testing.TB, d time.Duration, what string, f func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if !finishes(ctx, f) {
		t.Fatalf("%s did not finish within %v", what, d)
	}
}

// finishes runs f in a goroutine of its own and reports whether it
// returned before ctx ended.
func finishes(ctx context.Context, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// stallWatch bounds work by its progress rather than by its total time:
// its context ends once progress has not been reported for the stall
// duration. A test that does a lot at once (hundreds of mTLS handshakes,
// megabytes through one agent stream) takes as long as the machine needs
// while other jobs share its cores, so a fixed budget for the whole can
// run out although nothing is stuck; a stall means something is.
type stallWatch struct {
	ctx   context.Context
	stall time.Duration
	mu    sync.Mutex
	timer *time.Timer // guarded by mu: Reset is not documented as concurrency-safe
}

// newStallWatch starts a watch that ends when tb's test does, or after
// stall without progress.
func newStallWatch(tb testing.TB, stall time.Duration) *stallWatch {
	ctx, cancel := context.WithCancelCause(tb.Context())
	w := &stallWatch{ctx: ctx, stall: stall}
	w.timer = time.AfterFunc(stall, func() { cancel(fmt.Errorf("no progress for %v", stall)) })
	tb.Cleanup(func() {
		w.mu.Lock()
		w.timer.Stop()
		w.mu.Unlock()
		cancel(context.Canceled)
	})
	return w
}

// progress reports progress: the watch waits stall again from now.
func (w *stallWatch) progress() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() == nil {
		w.timer.Reset(w.stall)
	}
}

// wait runs f and fails the test if the watch ends first (f, or the
// goroutines it waits for, stopped making progress). f keeps running
// after a failure; it must end when the test ends, as for within.
func (w *stallWatch) wait(tb testing.TB, what string, f func()) {
	tb.Helper()
	if !finishes(w.ctx, f) {
		tb.Fatalf("%s stalled: %v", what, context.Cause(w.ctx))
	}
}

// progressReader reports each successful Read to a stallWatch.
type progressReader struct {
	r io.Reader
	w *stallWatch
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.w.progress()
	}
	return n, err
}

// httpTarget is a local HTTP server that answers every GET with a body
// naming the path.
func httpTarget(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the target: %s", r.URL.Path)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// get fetches url with c and returns the body of a 200 answer.
func get(t testing.TB, c *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	rsp, err := c.Do(req)
	require.NoError(t, err, "GET %s", url)
	defer rsp.Body.Close()
	body, err := io.ReadAll(rsp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, rsp.StatusCode, "GET %s: %s", url, body)
	return string(body)
}

func TestGETThroughTunnel(t *testing.T) {
	f := startFixture(t, ServerOptions{}, nil)
	target := httpTarget(t)
	for _, m := range frontendModes {
		t.Run(m.name, func(t *testing.T) {
			c := HTTPClient(t, m.dial(f.srv))
			for _, path := range []string{"/a", "/b"} { // two tunnels, one after the other
				body := get(t, c, target.URL+path)
				assert.Equal(t, "hello from the target: "+path, body)
			}
		})
	}
	// Every tunnel ends with its HTTP connection.
	require.Eventually(t, func() bool { return metric(t, f.srv.Registry(), metricEstablished) == 0 }, waitFor, tick)
	require.Eventually(t, func() bool { return metric(t, f.agent.Registry(), metricAgentEndpoints) == 0 }, waitFor, tick)
}

func TestDialErrors(t *testing.T) {
	refused := func(t testing.TB) string { return nettest.Refused(t, "127.0.0.1") }
	tests := []struct {
		name string
		// addr returns the address to dial.
		addr        func(t testing.TB) string
		serverOpts  ServerOptions
		dialTimeout time.Duration // of the agent; 0 is the default
		// wantErr is in the gRPC tunnel's dial error; wantStatus is the
		// HTTP CONNECT status.
		wantErr    string
		wantStatus int
	}{
		{name: "refused port", addr: refused, wantErr: "connection refused", wantStatus: http.StatusBadGateway},
		// A 64-byte label is not a valid DNS name: Go's resolver (pinned
		// in main_test.go) fails it without a query, so nothing leaves the
		// machine, as a query for a name under .invalid might. ("bad host"
		// would do for gRPC, but HTTP CONNECT refuses it with 400 before
		// the proxy-server sees it.)
		{name: "unresolvable host", addr: func(testing.TB) string { return strings.Repeat("a", 64) + ".invalid:80" }, wantErr: "no such host", wantStatus: http.StatusBadGateway},
		// The agent's own dial times out: the server maps "i/o timeout"
		// to 504.
		{name: "agent dial timeout", addr: nettest.Blackhole, dialTimeout: 200 * time.Millisecond, wantErr: "i/o timeout", wantStatus: http.StatusGatewayTimeout},
		// The agent is still dialing when the server gives up.
		{name: "server backend dial timeout", addr: nettest.Blackhole, serverOpts: ServerOptions{BackendDialTimeout: 200 * time.Millisecond},
			wantErr: "timed out waiting for backend dial", wantStatus: http.StatusGatewayTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			f := startFixture(t, tt.serverOpts, func(cfg *agent.Config) {
				if tt.dialTimeout > 0 {
					cfg.DialTimeout = tt.dialTimeout
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), waitFor)
			defer cancel()

			conn, err := f.srv.DialGRPC(ctx, addr)
			if conn != nil {
				conn.Close()
			}
			require.Error(t, err, "gRPC tunnel dial of %s", addr)
			assert.Contains(t, err.Error(), tt.wantErr)

			conn, err = f.srv.DialHTTPConnect(ctx, addr)
			if conn != nil {
				conn.Close()
			}
			var ce *ConnectError
			require.ErrorAs(t, err, &ce, "HTTP CONNECT of %s", addr)
			assert.Equal(t, tt.wantStatus, ce.StatusCode, "HTTP CONNECT status; body %q", ce.Body)

			require.Equal(t, 0.0, metric(t, f.srv.Registry(), metricPendingDials))
			// The server still works.
			assert.True(t, f.srv.Core().Ready())
		})
	}
}

func TestCloseBothWays(t *testing.T) {
	f := startFixture(t, ServerOptions{}, nil)

	// The client closes: the target reads "ping", then EOF.
	clientClosed := make(chan error, 1)
	readsPingThenEOF := nettest.StartTarget(t, func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			clientClosed <- fmt.Errorf("read ping: %w", err)
			return
		}
		_, err := c.Read(buf)
		clientClosed <- err
	})
	// The target closes: it reads "ping", writes "bye" and closes. (It
	// waits for the client to speak first because the konnectivity-client
	// library (v0.37.1) drops DATA that arrives right after DIAL_RSP, before
	// DialContext has registered the connection: a race in the client, not
	// in the server or the agent.)
	saysBye := nettest.StartTarget(t, func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := io.ReadFull(c, make([]byte, 4)); err == nil {
			_, _ = io.WriteString(c, "bye")
		}
	})

	for _, m := range frontendModes {
		t.Run(m.name+"/client closes", func(t *testing.T) {
			conn, err := m.dial(f.srv)(t.Context(), readsPingThenEOF.Addr())
			require.NoError(t, err)
			_, err = io.WriteString(conn, "ping")
			require.NoError(t, err)
			require.NoError(t, conn.Close())
			select {
			case err := <-clientClosed:
				require.ErrorIs(t, err, io.EOF, "target's read after the client closed")
			case <-time.After(waitFor):
				t.Fatal("the target never saw the close")
			}
		})
		t.Run(m.name+"/target closes", func(t *testing.T) {
			conn, err := m.dial(f.srv)(t.Context(), saysBye.Addr())
			require.NoError(t, err)
			defer conn.Close()
			_, err = io.WriteString(conn, "ping")
			require.NoError(t, err)
			var got []byte
			within(t, waitFor, "reading to EOF", func() { got, err = io.ReadAll(conn) })
			require.NoError(t, err, "ReadAll stops at EOF")
			assert.Equal(t, "bye", string(got))
		})
	}
	require.Eventually(t, func() bool { return metric(t, f.srv.Registry(), metricEstablished) == 0 }, waitFor, tick)
	require.Eventually(t, func() bool { return metric(t, f.agent.Registry(), metricAgentEndpoints) == 0 }, waitFor, tick)
	// Each closed tunnel is one observation of how long it was
	// established (upstream's histogram of master, #899).
	assert.Equal(t, float64(2*len(frontendModes)), metric(t, f.srv.Registry(), "konnectivity_network_proxy_server_connection_duration_seconds"),
		"tunnels observed in the connection-duration histogram")
}

func TestCancelPendingDial(t *testing.T) {
	addr := nettest.Blackhole(t)
	f := startFixture(t, ServerOptions{}, nil) // the agent's dial waits 5 s
	for _, m := range frontendModes {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				conn, err := m.dial(f.srv)(ctx, addr)
				if conn != nil {
					conn.Close()
				}
				errc <- err
			}()
			require.Eventually(t, func() bool { return metric(t, f.srv.Registry(), metricPendingDials) == 1 }, waitFor, tick,
				"the dial never reached the server")
			start := time.Now()
			cancel()
			select {
			case err := <-errc:
				require.Error(t, err)
				assert.Less(t, time.Since(start), time.Second, "the dial returned slowly after the cancel")
			case <-time.After(waitFor):
				t.Fatal("the dial did not return after its context was cancelled")
			}
			// The server forgets the dial (DIAL_CLS, or the CONNECT
			// connection closed).
			require.Eventually(t, func() bool { return metric(t, f.srv.Registry(), metricPendingDials) == 0 }, waitFor, tick)
		})
	}
	assert.True(t, f.srv.Core().Ready())
}

func TestAgentDisconnectsMidStream(t *testing.T) {
	for _, m := range frontendModes {
		t.Run(m.name, func(t *testing.T) {
			f := startFixture(t, ServerOptions{}, nil)
			echo := nettest.StartTarget(t, Echo)
			conn, err := m.dial(f.srv)(t.Context(), echo.Addr())
			require.NoError(t, err)
			defer conn.Close()

			// A transfer in both directions, until the tunnel breaks.
			var wg sync.WaitGroup
			var readErr error
			read := make(chan struct{}, 1) // something came back
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					if _, err := conn.Read(buf); err != nil {
						readErr = err
						return
					}
					select {
					case read <- struct{}{}:
					default:
					}
				}
			})
			wg.Go(func() {
				chunk := make([]byte, 16<<10)
				for {
					if _, err := conn.Write(chunk); err != nil {
						return
					}
				}
			})
			select {
			case <-read:
			case <-time.After(waitFor):
				t.Fatal("no data came back through the tunnel")
			}

			f.agent.Stop()
			within(t, waitFor, "the frontend connection's end", func() { wg.Wait() })
			if readErr != io.EOF {
				t.Logf("read ended with %v", readErr) // an error is as good as EOF here
			}

			// The server is alive, not ready, and serves a new agent.
			require.Eventually(t, func() bool { return !f.srv.Core().Ready() }, waitFor, tick)
			rsp, err := http.Get(f.srv.HealthURL() + "/healthz")
			require.NoError(t, err)
			rsp.Body.Close()
			assert.Equal(t, http.StatusOK, rsp.StatusCode)
			StartAgent(t, f.env, FastAgentConfig("agent-2", f.srv.AgentAddr()))
			require.Eventually(t, f.srv.Core().Ready, waitFor, tick)
			target := httpTarget(t)
			assert.Equal(t, "hello from the target: /again", get(t, HTTPClient(t, m.dial(f.srv)), target.URL+"/again"))
		})
	}
}

func TestConcurrentTunnels(t *testing.T) {
	const perMode = 100
	const size = 64 << 10
	// dialsInFlight bounds the handshakes running at once. With all 200 at
	// once they share the CPU and finish together, so the first sign of
	// progress comes as late as the last; a few at a time finish one
	// after another. The tunnels still all end up open at once.
	const dialsInFlight = 8
	f := startFixture(t, ServerOptions{}, nil)
	echo := nettest.StartTarget(t, Echo)
	// Neither the dials nor the transfers have a budget for the whole:
	// under load they take longer, but each dial and each read keeps
	// coming (see stallWatch).
	watch := newStallWatch(t, waitFor)

	// Open every tunnel first, so that all of them are open at once.
	type tunnel struct {
		name string
		conn net.Conn
	}
	tunnels := make([]tunnel, 0, 2*perMode)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errc := make(chan error, 2*perMode)
	slots := make(chan struct{}, dialsInFlight)
	for _, m := range frontendModes {
		dial := m.dial(f.srv)
		for i := range perMode {
			wg.Go(func() {
				select {
				case slots <- struct{}{}:
				case <-watch.ctx.Done():
					errc <- fmt.Errorf("%s #%d: not dialed: %w", m.name, i, context.Cause(watch.ctx))
					return
				}
				defer func() { <-slots }()
				conn, err := dial(watch.ctx, echo.Addr())
				if err != nil {
					errc <- fmt.Errorf("%s #%d: %w", m.name, i, err)
					return
				}
				watch.progress()
				mu.Lock()
				tunnels = append(tunnels, tunnel{name: fmt.Sprintf("%s #%d", m.name, i), conn: conn})
				mu.Unlock()
			})
		}
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, tn := range tunnels {
			tn.conn.Close()
		}
	}()
	watch.wait(t, "opening the tunnels", wg.Wait)
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	require.Len(t, tunnels, 2*perMode)
	// The server counts a tunnel before it answers the dial, so every
	// tunnel is counted once its dial has returned.
	require.Equal(t, float64(2*perMode), metric(t, f.srv.Registry(), metricEstablished), "tunnels open at once")

	// Then send 64 KiB of random bytes through each, and check the echo.
	// Every tunnel transfers at once, over the one agent stream.
	errc = make(chan error, 2*perMode)
	for _, tn := range tunnels {
		wg.Go(func() {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			go func() { _, _ = tn.conn.Write(data) }() // a failed write shows as a short read
			got := make([]byte, size)
			if _, err := io.ReadFull(progressReader{r: tn.conn, w: watch}, got); err != nil {
				errc <- fmt.Errorf("%s: read the echo: %w", tn.name, err)
				return
			}
			if !bytes.Equal(data, got) {
				errc <- fmt.Errorf("%s: the echo differs from what was sent", tn.name)
			}
		})
	}
	watch.wait(t, "the transfers", wg.Wait)
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func TestHA(t *testing.T) {
	env := NewEnv(t, "proxytest-ca")
	count := servercounter.StaticServerCounter(3)
	servers := make([]*Server, 3)
	for i := range servers {
		// Each server on its own loopback address, as in a cluster.
		servers[i] = StartServer(t, env, ServerOptions{ID: fmt.Sprintf("server-%d", i+1), Count: count, Addr: fmt.Sprintf("127.0.0.%d:0", i+1)})
	}
	agentAddrs := func(ss ...*Server) []string {
		var addrs []string
		for _, s := range ss {
			addrs = append(addrs, s.AgentAddr())
		}
		return addrs
	}
	lb, err := balancertest.New(agentAddrs(servers...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lb.Close() }) // the error is the listener's: nothing to check

	ag := StartAgent(t, env, FastAgentConfig("agent-1", lb.Addr()))
	cs := ag.ClientSet()
	require.Eventually(t, func() bool { return cs.Connected() == 3 }, waitFor, tick, "the agent never reached 3 servers")
	assert.Equal(t, 3, cs.Target())

	target := httpTarget(t)
	for _, s := range servers {
		assert.Equal(t, "hello from the target: /"+s.ID(), get(t, HTTPClient(t, s.DialGRPC), target.URL+"/"+s.ID()))
	}

	// Stop server-2, taking it out of the balancertest.
	lb.SetBackends(agentAddrs(servers[0], servers[2])...)
	servers[1].Stop()
	require.Eventually(t, func() bool { return cs.Connected() == 2 }, waitFor, tick, "the agent kept a stopped server")

	// A fresh server behind the balancer brings it back to 3.
	fresh := StartServer(t, env, ServerOptions{ID: "server-4", Count: count})
	lb.SetBackends(agentAddrs(servers[0], servers[2], fresh)...)
	require.Eventually(t, func() bool { return cs.Connected() == 3 }, waitFor, tick, "the agent never found the fresh server")
	require.Eventually(t, fresh.Core().Ready, waitFor, tick)
	assert.Equal(t, "hello from the target: /fresh", get(t, HTTPClient(t, fresh.DialHTTPConnect), target.URL+"/fresh"))
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestAgentAuth(t *testing.T) {
	env := NewEnv(t, "proxytest-ca")
	other := NewEnv(t, "another-ca")
	// tlsOptions trusts env's server certificates and presents cert.
	tlsOptions := func(certs ...tls.Certificate) []grpc.DialOption {
		return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: certs,
			RootCAs:      env.CA.Pool(),
			MinVersion:   tls.VersionTLS12,
		}))}
	}
	otherCert, err := other.CA.Client("agent-bad")
	require.NoError(t, err)

	tests := []struct {
		name string
		// token, if set, is the only token the server accepts.
		token string
		// bad changes the bad agent's configuration.
		bad func(t *testing.T, cfg *agent.Config)
		// good changes the good agent's configuration.
		good func(t *testing.T, cfg *agent.Config)
	}{
		{
			name: "client certificate from another CA",
			bad:  func(_ *testing.T, cfg *agent.Config) { cfg.DialOptions = tlsOptions(otherCert.TLS) },
		},
		{
			name: "no client certificate",
			bad:  func(_ *testing.T, cfg *agent.Config) { cfg.DialOptions = tlsOptions() },
		},
		{
			name:  "wrong token",
			token: "good-token",
			bad:   func(t *testing.T, cfg *agent.Config) { cfg.TokenPath = writeFile(t, "token", "wrong-token\n") },
			good:  func(t *testing.T, cfg *agent.Config) { cfg.TokenPath = writeFile(t, "token", "good-token\n") },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := logs.Capture(t)
			opts := ServerOptions{}
			if tt.token != "" {
				opts.Authenticator, err = server.NewTokenFileAuthenticator(writeFile(t, "tokens", "# accepted\n"+tt.token+"\n"))
				require.NoError(t, err)
			}
			srv := StartServer(t, env, opts)

			badCfg := FastAgentConfig("agent-bad", srv.AgentAddr())
			tt.bad(t, &badCfg)
			bad := StartAgent(t, env, badCfg)
			goodCfg := FastAgentConfig("agent-good", srv.AgentAddr())
			if tt.good != nil {
				tt.good(t, &goodCfg)
			}
			good := StartAgent(t, env, goodCfg)

			require.Eventually(t, func() bool { return good.ClientSet().Connected() == 1 }, waitFor, tick, "the good agent never connected")
			require.Eventually(t, func() bool { return metric(t, bad.Registry(), metricAgentDials, "result", "error") >= 3 }, waitFor, tick,
				"the bad agent did not retry")
			assert.Equal(t, 0, bad.ClientSet().Connected(), "the bad agent connected")
			assert.Equal(t, 1, srv.Core().Backends(), "only the good agent is a backend")

			// Nothing else broke: a tunnel through the good agent works.
			target := httpTarget(t)
			assert.Equal(t, "hello from the target: /ok", get(t, HTTPClient(t, srv.DialGRPC), target.URL+"/ok"))

			bad.Stop()
			rejected := metric(t, srv.Registry(), metricRejections, "reason", "unauthenticated")
			if tt.token == "" {
				// TLS refuses the agent before the server sees a stream;
				// the agent port's credentials log it, one line a try.
				assert.Equal(t, 0.0, rejected)
				require.Eventually(t, func() bool {
					return strings.Contains(logs.String(), `"Refused TLS connection"`) && strings.Contains(logs.String(), `port="agent"`)
				}, waitFor, tick, "a log line for the refused TLS connection")
				return
			}
			// One clear line per rejection, naming the agent and the reason.
			assert.GreaterOrEqual(t, rejected, 1.0)
			var lines []string
			// A handshake the agent gave up on when it stopped may be
			// counted and not yet logged: wait for the two to agree.
			require.Eventually(t, func() bool {
				rejected = metric(t, srv.Registry(), metricRejections, "reason", "unauthenticated")
				lines = lines[:0]
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, "Rejected agent stream") {
						lines = append(lines, l)
					}
				}
				return len(lines) == int(rejected)
			}, waitFor, tick, "one log line per rejection")
			for _, l := range lines {
				assert.Contains(t, l, `agentID="agent-bad"`)
				assert.Contains(t, l, `reason="unauthenticated"`)
				assert.Contains(t, l, "token rejected")
			}
			if len(lines) > 0 {
				t.Logf("the server logged: %s", lines[0])
			}
		})
	}
}
