package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

func TestParseStrategies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    []server.Strategy
		wantErr string
	}{
		{name: "one", in: "default", want: []server.Strategy{server.StrategyDefault}},
		{name: "ordered list with spaces", in: "destHost, defaultRoute,default", want: []server.Strategy{server.StrategyDestHost, server.StrategyDefaultRoute, server.StrategyDefault}},
		{name: "unknown", in: "destHost,nearest", wantErr: `unknown proxy strategy "nearest" in "destHost,nearest": valid strategies are default, destHost, defaultRoute`},
		{name: "empty", in: "", wantErr: "empty proxy strategy list"},
		{name: "empty element", in: "default,", wantErr: `unknown proxy strategy ""`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := server.ParseStrategies(tc.in)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := server.New(server.Config{Strategies: []server.Strategy{"nearest"}, Heartbeat: time.Nanosecond})
	require.Error(t, err)
	for _, want := range []string{"server ID is empty", `unknown proxy strategy "nearest"`, "heartbeat 1ns: want 10ms to 1h0m0s, or -1 for none"} {
		assert.ErrorContains(t, err, want)
	}
}

func TestNewRegistersMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	srv, err := server.New(server.Config{ServerID: "s1", Registerer: reg})
	require.NoError(t, err)
	defer srv.Close()
	assert.Equal(t, 0.0, metricValue(t, reg, "konnectivity_network_proxy_server_ready_backend_connections", nil))
	_, ok := metricstest.Value(reg, "konnectivity_network_proxy_server_dial_failure_count")
	assert.False(t, ok, "upstream's labelled series appear when they first happen")
	assert.Equal(t, 0.0, metricValue(t, reg, "servercount_server_agent_rejections_total", map[string]string{"reason": "unauthenticated"}))
	_, err = server.New(server.Config{ServerID: "s2", Registerer: reg})
	assert.ErrorContains(t, err, "register proxy-server metrics")
}

func TestTokenFileAuthenticator(t *testing.T) {
	t.Parallel()
	a := tokenFileAuth(t, "# agents\n\n  good-token  \nother\n")
	tests := []struct {
		name, token string
		wantErr     bool
	}{
		{name: "listed", token: "good-token"},
		{name: "second listed", token: "other"},
		{name: "not listed", token: "bad", wantErr: true},
		{name: "comment is not a token", token: "# agents", wantErr: true},
		{name: "empty", token: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := a.AuthenticateToken(t.Context(), tc.token)
			if tc.wantErr {
				assert.Error(t, err)
			} else {
				assert.NoError(t, err)
			}
		})
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# none\n"), 0o600))
	_, err := server.NewTokenFileAuthenticator(empty)
	assert.ErrorContains(t, err, "holds no token")
	_, err = server.NewTokenFileAuthenticator(filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "read agent token file")
}

func TestHandshakeHeadersFollowCounter(t *testing.T) {
	t.Parallel()
	counter := &settableCounter{}
	counter.n.Store(3)
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{ServerID: "server-a", Counter: counter, Registerer: reg})

	a := startAgent(t, e, agentOpts{id: "agent-1"})
	assert.Equal(t, []string{"server-a"}, a.Header().Get(wire.HeaderServerID))
	assert.Equal(t, []string{"3"}, a.Header().Get(wire.HeaderServerCount))
	assert.Equal(t, 3.0, metricValue(t, reg, "servercount_server_reported_server_count", nil))

	counter.n.Store(5)
	b := startAgent(t, e, agentOpts{id: "agent-1"}) // a second stream of the same agent
	assert.Equal(t, []string{"5"}, b.Header().Get(wire.HeaderServerCount))
	waitBackends(t, e, 2)
	assert.Equal(t, 5.0, metricValue(t, reg, "servercount_server_reported_server_count", nil))
	assert.Equal(t, 2.0, metricValue(t, reg, "konnectivity_network_proxy_server_ready_backend_connections", nil))
}

// metricValue gathers reg and returns the value of the series of name
// whose labels include labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	var kv []string
	for k, v := range labels {
		kv = append(kv, k, v)
	}
	v, ok := metricstest.Value(reg, name, kv...)
	if !ok {
		t.Fatalf("metric %s%v not found", name, labels)
	}
	return v
}

func TestHandshakeRejections(t *testing.T) {
	t.Parallel()
	plain := startEnv(t, server.Config{})
	withAuth := startEnv(t, server.Config{Authenticator: tokenFileAuth(t, "s3cret\n")})

	tests := []struct {
		name     string
		env      *env
		opts     agentOpts
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "missing agentID", env: plain, opts: agentOpts{}, wantCode: codes.InvalidArgument, wantMsg: "want exactly one non-empty agentID"},
		{name: "duplicate agentID", env: plain, opts: agentOpts{id: "a", extraMD: []string{wire.HeaderAgentID, "b"}}, wantCode: codes.InvalidArgument, wantMsg: "got 2"},
		{name: "bad identifiers", env: plain, opts: agentOpts{id: "a", identifiers: "default-route=perhaps"}, wantCode: codes.InvalidArgument, wantMsg: "default-route"},
		// An unauthenticated agent learns nothing
		// but that it failed (the test checks the whole message).
		{name: "missing token", env: withAuth, opts: agentOpts{id: "a"}, wantCode: codes.Unauthenticated, wantMsg: "authentication failed"},
		{name: "bad token", env: withAuth, opts: agentOpts{id: "a", token: "guess"}, wantCode: codes.Unauthenticated, wantMsg: "authentication failed"},
		{name: "not bearer", env: withAuth, opts: agentOpts{id: "a", extraMD: []string{wire.HeaderAuthorization, "Basic s3cret"}}, wantCode: codes.Unauthenticated, wantMsg: "authentication failed"},
		{name: "bad token and no agentID", env: withAuth, opts: agentOpts{token: "guess"}, wantCode: codes.Unauthenticated, wantMsg: "authentication failed"},
		{name: "good token", env: withAuth, opts: agentOpts{id: "a", token: "s3cret"}, wantCode: codes.OK},
		{name: "no token needed", env: plain, opts: agentOpts{id: "a", token: "anything"}, wantCode: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := connectAgent(t, tc.env, tc.opts)
			if tc.wantCode == codes.OK {
				require.NoError(t, err)
				assert.Equal(t, []string{"s1"}, a.Header().Get(wire.HeaderServerID))
				a.Close()
				return
			}
			require.Error(t, err)
			st, _ := status.FromError(err)
			assert.Equal(t, tc.wantCode, st.Code(), "status: %v", err)
			if tc.wantCode == codes.Unauthenticated {
				assert.Equal(t, tc.wantMsg, st.Message())
			} else {
				assert.Contains(t, st.Message(), tc.wantMsg)
			}
		})
	}
	// A refused agent breaks nothing: a good one still works.
	startAgent(t, withAuth, agentOpts{id: "ok", token: "s3cret"})
	waitBackends(t, withAuth, 1)
}

// httpTarget starts an HTTP server answering "hello from <path>".
func httpTarget(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// grpcTunnel opens a konnectivity-client single-use tunnel to e.
func grpcTunnel(t *testing.T, e *env) kclient.Tunnel {
	t.Helper()
	tun, err := kclient.CreateSingleUseGrpcTunnel(t.Context(), e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(t, err)
	t.Cleanup(func() {
		select {
		case <-tun.Done():
		case <-time.After(waitFor):
			t.Errorf("tunnel did not end")
		}
	})
	return tun
}

func TestGRPCFrontendGET(t *testing.T) {
	t.Parallel()
	e, _ := startEnvAndAgent(t, server.Config{})
	target := httpTarget(t)

	tun := grpcTunnel(t, e)
	conn, err := tun.DialContext(t.Context(), "tcp", target.Listener.Addr().String())
	require.NoError(t, err)
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: waitFor}).Get(target.URL + "/through-grpc")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "hello from /through-grpc", string(body))
}

// A dial that cannot be made is answered, on either frontend, with the
// error that says why.
func TestFrontendDialErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		withAgent bool
		method    string // sent to the HTTP CONNECT port; "" dials through the gRPC frontend
		wantErr   string // the gRPC dial's
		wantCode  int    // the HTTP answer's
	}{
		{name: "grpc refused port", withAgent: true, wantErr: "connection refused"},
		{name: "grpc no agent", withAgent: false, wantErr: "No agent available"},
		{name: "connect refused port", method: http.MethodConnect, withAgent: true, wantCode: http.StatusBadGateway},
		{name: "connect no agent", method: http.MethodConnect, wantCode: http.StatusInternalServerError},
		{name: "not CONNECT", method: http.MethodGet, withAgent: true, wantCode: http.StatusMethodNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t, server.Config{})
			if tc.withAgent {
				startAgent(t, e, agentOpts{id: "a1"})
				waitBackends(t, e, 1)
			}
			refused := nettest.Refused(t, "127.0.0.1")
			if tc.method == "" {
				_, err := grpcTunnel(t, e).DialContext(t.Context(), "tcp", refused)
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			_, _, code := connectVia(t, e, tc.method, refused)
			assert.Equal(t, tc.wantCode, code)
		})
	}
}

// connectVia sends CONNECT address to the HTTP CONNECT frontend and returns
// the connection, its reader and the response status.
func connectVia(t *testing.T, e *env, method, address string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	target := address
	if method != http.MethodConnect {
		target = "/"
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\n\r\n", method, target, address)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
	}
	return c, br, resp.StatusCode
}

func TestHTTPConnectGET(t *testing.T) {
	t.Parallel()
	e, _ := startEnvAndAgent(t, server.Config{})
	target := httpTarget(t)

	c, br, code := connectVia(t, e, http.MethodConnect, target.Listener.Addr().String())
	require.Equal(t, http.StatusOK, code)
	fmt.Fprintf(c, "GET /through-connect HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "hello from /through-connect", string(body))
	// The target closed after the response: the tunnel closes too.
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
}

func TestHTTPConnectBackendDialTimeout(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{BackendDialTimeout: 200 * time.Millisecond})
	// An agent that never answers dials.
	_, err := connectAgent(t, e, agentOpts{id: "mute"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	_, _, code := connectVia(t, e, http.MethodConnect, "127.0.0.1:9")
	assert.Equal(t, http.StatusGatewayTimeout, code)
}

func TestAgentDiesMidTunnel(t *testing.T) {
	t.Parallel()
	e, a := startEnvAndAgent(t, server.Config{})
	echo := echoServer(t)

	// gRPC frontend: the raw stream sees CLOSE_RSP.
	cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(t, err)
	defer cc.Close()
	stream, err := client.NewProxyServiceClient(cc).Proxy(t.Context())
	require.NoError(t, err)
	require.NoError(t, stream.Send(wire.DialReq("tcp", echo, 42)))
	pkt, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, client.PacketType_DIAL_RSP, pkt.GetType())
	require.Empty(t, pkt.GetDialResponse().GetError())
	id := pkt.GetDialResponse().GetConnectID()

	// HTTP CONNECT frontend on the same agent.
	_, br, code := connectVia(t, e, http.MethodConnect, echo)
	require.Equal(t, http.StatusOK, code)

	a.stop()
	pkt, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, client.PacketType_CLOSE_RSP, pkt.GetType())
	assert.Equal(t, id, pkt.GetCloseResponse().GetConnectID())
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	waitBackends(t, e, 0)
}

func TestFrontendDiesClosesAtAgent(t *testing.T) {
	t.Parallel()
	e, a := startEnvAndAgent(t, server.Config{})
	echo := echoServer(t)

	t.Run("grpc stream ends", func(t *testing.T) {
		cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		stream, err := client.NewProxyServiceClient(cc).Proxy(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(wire.DialReq("tcp", echo, 7)))
		pkt, err := stream.Recv()
		require.NoError(t, err)
		id := pkt.GetDialResponse().GetConnectID()
		cancel()
		cc.Close()
		assertCloseReq(t, a, id)
	})
	t.Run("http client closes", func(t *testing.T) {
		c, _, code := connectVia(t, e, http.MethodConnect, echo)
		require.Equal(t, http.StatusOK, code)
		c.Close()
		assertCloseReq(t, a, 2)
	})
}

func assertCloseReq(t *testing.T, a *testAgent, want int64) {
	t.Helper()
	select {
	case got := <-a.closeCh:
		assert.Equal(t, want, got)
	case <-time.After(waitFor):
		t.Fatalf("agent got no CLOSE_REQ for connection %d", want)
	}
}

func TestStrategies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		strategies string
		agents     []agentOpts
		drain      string // agent that sends DRAIN
		address    string
		want       string // agent expected to get every dial; "" for none
	}{
		{name: "destHost by host name", strategies: "destHost,default", address: "node-b:80",
			agents: []agentOpts{{id: "a", identifiers: "host=node-a"}, {id: "b", identifiers: "host=node-b"}}, want: "b"},
		{name: "destHost by ipv4", strategies: "destHost", address: "10.0.0.2:443",
			agents: []agentOpts{{id: "a", identifiers: "ipv4=10.0.0.1"}, {id: "b", identifiers: "ipv4=10.0.0.2"}}, want: "b"},
		{name: "destHost by ipv6", strategies: "destHost", address: "[fd00::2]:443",
			agents: []agentOpts{{id: "a", identifiers: "ipv6=fd00::1"}, {id: "b", identifiers: "ipv6=fd00:0::2"}}, want: "b"},
		{name: "destHost without match", strategies: "destHost", address: "node-c:80",
			agents: []agentOpts{{id: "a", identifiers: "host=node-a"}}, want: ""},
		{name: "destHost falls back to default", strategies: "destHost,default", address: "node-c:80",
			agents: []agentOpts{{id: "a", identifiers: "host=node-a"}}, want: "a"},
		{name: "defaultRoute", strategies: "defaultRoute", address: "example.com:80",
			agents: []agentOpts{{id: "a"}, {id: "b", identifiers: "default-route=true"}, {id: "c"}}, want: "b"},
		{name: "default skips a draining agent", strategies: "default", address: "example.com:80",
			agents: []agentOpts{{id: "a"}, {id: "b"}}, drain: "a", want: "b"},
		{name: "default uses a draining agent when all drain", strategies: "default", address: "example.com:80",
			agents: []agentOpts{{id: "a"}}, drain: "a", want: "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			strategies, err := server.ParseStrategies(tc.strategies)
			require.NoError(t, err)
			e := startEnv(t, server.Config{Strategies: strategies})
			agents := map[string]*testAgent{}
			for _, o := range tc.agents {
				agents[o.id] = startAgent(t, e, o)
			}
			waitBackends(t, e, len(tc.agents))
			if tc.drain != "" {
				agents[tc.drain].drainAndSync(t)
			}
			// The addresses are not loopback: the test agent refuses the
			// dial without trying; what counts is which agent was asked.
			for range 8 {
				got := rawDial(t, e, tc.address)
				if tc.want == "" {
					assert.Equal(t, "No agent available", got)
				} else {
					assert.Equal(t, "test agent dials only loopback addresses", got)
				}
			}
			for id, a := range agents {
				want := int64(0)
				if id == tc.want {
					want = 8
				}
				assert.Equal(t, want, a.dials.Load(), "dials asked of agent %s", id)
			}
		})
	}
}

// rawDial sends one DIAL_REQ on a fresh ProxyService stream and returns
// the DIAL_RSP's error text.
func rawDial(t *testing.T, e *env, address string) string {
	t.Helper()
	cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	stream, err := client.NewProxyServiceClient(cc).Proxy(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(wire.DialReq("tcp", address, 1)))
	pkt, err := stream.Recv()
	require.NoError(t, err)
	return pkt.GetDialResponse().GetError()
}

func TestConcurrentTunnels(t *testing.T) {
	t.Parallel()
	const (
		tunnels = 200
		size    = 64 << 10
		// dialsInFlight bounds the handshakes running at once. Each dial
		// has waitFor, but 200 mTLS handshakes at once share the CPU and
		// finish together, which on a shared 2-core machine under the race
		// detector can take longer than that although nothing is stuck.
		// The transfers still overlap.
		dialsInFlight = 8
	)
	e, _ := startEnvAndAgent(t, server.Config{})
	echo := echoServer(t)

	var wg sync.WaitGroup
	errs := make(chan error, tunnels)
	dialing := make(chan struct{}, dialsInFlight)
	for i := range tunnels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoThrough(t, e, echo, size, i%2 == 0, dialing)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

// echoThrough sends size random bytes to the echo server through one
// tunnel (gRPC frontend, or HTTP CONNECT) and checks what comes back. It
// holds a slot of dialing while it opens the tunnel.
func echoThrough(t *testing.T, e *env, echo string, size int, viaGRPC bool, dialing chan struct{}) error {
	var conn net.Conn
	var r io.Reader
	dialing <- struct{}{}
	dialed := func() { <-dialing }
	if viaGRPC {
		tun, err := kclient.CreateSingleUseGrpcTunnel(t.Context(), e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
		if err != nil {
			dialed()
			return err
		}
		defer func() {
			select {
			case <-tun.Done():
			case <-time.After(waitFor):
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), waitFor)
		defer cancel()
		conn, err = tun.DialContext(ctx, "tcp", echo)
		dialed()
		if err != nil {
			return err
		}
		// The library's connection has no deadlines: a read that never
		// ends is caught by go test's -timeout.
		r = conn
	} else {
		c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
		if err != nil {
			dialed()
			return err
		}
		_ = c.SetDeadline(time.Now().Add(waitFor))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", echo, echo)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		dialed()
		if err != nil {
			c.Close()
			return err
		}
		if resp.StatusCode != http.StatusOK {
			c.Close()
			return fmt.Errorf("CONNECT answered %s", resp.Status)
		}
		// From here each read has waitFor, not the whole transfer: all
		// the tunnels share the agent stream, and under load the whole
		// takes as long as it takes while bytes keep coming. The write
		// needs no deadline: the deferred Close ends it.
		_ = c.SetDeadline(time.Time{})
		conn, r = c, readDeadlineReader{br: br, c: c}
	}
	defer conn.Close()
	want := make([]byte, size)
	_, _ = rand.Read(want)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(want)
		werr <- err
	}()
	got := make([]byte, size)
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(want, got) {
		return fmt.Errorf("echoed bytes differ from the %d sent", size)
	}
	return nil
}

// readDeadlineReader reads br (buffering c) with a deadline of waitFor
// for each read: a stall fails, a slow transfer does not.
type readDeadlineReader struct {
	br *bufio.Reader
	c  net.Conn
}

func (r readDeadlineReader) Read(p []byte) (int, error) {
	if err := r.c.SetReadDeadline(time.Now().Add(waitFor)); err != nil {
		return 0, err
	}
	return r.br.Read(p)
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{})
	get := func(path string) int {
		resp, err := http.Get(e.hzURL + path)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get("/healthz"))
	assert.Equal(t, http.StatusInternalServerError, get("/readyz"))
	assert.Equal(t, http.StatusInternalServerError, get("/ready"))
	a := startAgent(t, e, agentOpts{id: "a1"})
	require.Eventually(t, func() bool { return get("/readyz") == http.StatusOK }, waitFor, 5*time.Millisecond)
	assert.True(t, e.srv.Ready())
	a.stop()
	require.Eventually(t, func() bool { return get("/readyz") == http.StatusInternalServerError }, waitFor, 5*time.Millisecond)
	assert.False(t, e.srv.Ready())
}

func TestCloseEndsEverything(t *testing.T) {
	t.Parallel()
	e, a := startEnvAndAgent(t, server.Config{})
	echo := echoServer(t)
	_, br, code := connectVia(t, e, http.MethodConnect, echo)
	require.Equal(t, http.StatusOK, code)
	tun := grpcTunnel(t, e)
	_, err := tun.DialContext(t.Context(), "tcp", echo)
	require.NoError(t, err)

	e.srv.Close()
	select {
	case <-a.done:
	case <-time.After(waitFor):
		t.Fatal("agent stream did not end on Close")
	}
	_, err = br.ReadByte()
	assert.Error(t, err)
	// New agents are refused.
	_, err = connectAgent(t, e, agentOpts{id: "late"})
	assert.Equal(t, codes.Unavailable, status.Code(err), "err: %v", err)
	e.srv.Close() // twice is fine
}
