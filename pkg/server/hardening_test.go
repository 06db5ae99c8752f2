package server_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/logtest"
	"github.com/servercount/servercount/pkg/server"
)

// rawConnect sends a CONNECT request with the given request target and
// Host header to the HTTP CONNECT frontend and returns the status.
func rawConnect(t *testing.T, e *env, target, host string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// A CONNECT target the agent cannot dial is answered
// 400 by the server, and no DIAL_REQ reaches the agent.
func TestHTTPConnectRefusesInvalidTargets(t *testing.T) {
	t.Parallel()
	e, a := startEnvAndAgent(t, server.Config{})
	tests := []struct {
		name, target, host string
	}{
		{name: "empty", target: "", host: ""},
		{name: "slash", target: "/", host: "/"},
		{name: "host without port", target: "127.0.0.1", host: "127.0.0.1"},
		{name: "port without host", target: ":80", host: ":80"},
		{name: "port zero", target: "127.0.0.1:0", host: "127.0.0.1:0"},
		{name: "port too large", target: "127.0.0.1:65536", host: "127.0.0.1:65536"},
		{name: "named port", target: "127.0.0.1:http", host: "127.0.0.1:http"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, http.StatusBadRequest, rawConnect(t, e, tc.target, tc.host))
		})
	}
	assert.Zero(t, a.dials.Load(), "dial requests that reached the agent")
}

// An HTTP CONNECT client that disconnects while its
// dial is in flight leaves nothing open, whichever of its disconnect and
// the agent's DIAL_RSP the server handles first. The race is run many
// times at once: the agent closes the client's connection and answers
// the dial at the same moment. Every connection the agent opened must
// get a CLOSE_REQ, and established_connections must return to 0.
func TestHTTPConnectClientGoneDuringDialLeavesNothing(t *testing.T) {
	t.Parallel()
	const clients = 200
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})

	// Client i asks for port i+1; the agent closes client i's connection
	// when its DIAL_REQ arrives and answers it with connectID i+1.
	conns := make([]net.Conn, clients)
	for i := range conns {
		var err error
		conns[i], err = net.DialTimeout("tcp", e.connectAddr, waitFor)
		require.NoError(t, err)
		defer conns[i].Close()
	}
	a := startAgent(t, e, agentOpts{id: "racer", answer: func(req *client.DialRequest) int64 {
		_, portText, _ := net.SplitHostPort(req.GetAddress())
		port, _ := strconv.Atoi(portText)
		conns[port-1].Close()
		return int64(port)
	}})
	waitBackends(t, e, 1)
	for i, c := range conns {
		_, _ = fmt.Fprintf(c, "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", i+1, i+1)
	}

	got := map[int64]bool{}
	deadline := time.After(waitFor)
	for len(got) < clients {
		select {
		case id := <-a.closeCh:
			got[id] = true
		case <-deadline:
			t.Fatalf("%d of %d connections got no CLOSE_REQ; established_connections = %v", clients-len(got), clients,
				metricValue(t, reg, "konnectivity_network_proxy_server_established_connections", nil))
		}
	}
	require.Eventually(t, func() bool {
		return metricValue(t, reg, "konnectivity_network_proxy_server_established_connections", nil) == 0
	}, waitFor, 5*time.Millisecond, "established_connections did not return to 0")
	assert.Equal(t, 0.0, metricValue(t, reg, "konnectivity_network_proxy_server_pending_backend_dials", nil))
}

// A rejected agent's metadata is logged cut to a few
// hundred bytes, however large the agentID it sent (up to the header
// limit).
func TestRejectedAgentIDIsLoggedCapped(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{Authenticator: tokenFileAuth(t, "s3cret\n")})
	log := logs.Capture(t)

	marker := "huge-agent-" + strconv.Itoa(int(time.Now().UnixNano())) // this test's lines only
	agentID := marker + strings.Repeat("x", 48<<10)
	_, err := connectAgent(t, e, agentOpts{id: agentID, token: "guess"})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "err: %v", err)

	var line string
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, "Rejected agent stream") && strings.Contains(l, marker) {
				line = l
				return true
			}
		}
		return false
	}, waitFor, 5*time.Millisecond, "no rejection logged")
	assert.Less(t, len(line), 2<<10, "log line of %d bytes", len(line))
	assert.Contains(t, line, fmt.Sprintf("(%d bytes)", len(agentID)), "the cut value notes the length sent")
}

// A server logs through Config.Logger, not klog's global logger: a
// program that embeds it chooses where its lines go.
func TestServerLogsThroughItsLogger(t *testing.T) {
	t.Parallel()
	logger, buf := logtest.NewLogger(0)
	e := startEnv(t, server.Config{Authenticator: tokenFileAuth(t, "s3cret\n"), Logger: logger})
	global := logs.Capture(t)

	marker := "logger-agent-" + strconv.Itoa(int(time.Now().UnixNano()))
	_, err := connectAgent(t, e, agentOpts{id: marker, token: "guess"})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "err: %v", err)
	require.Eventually(t, func() bool {
		return strings.Contains(buf.String(), "Rejected agent stream") && strings.Contains(buf.String(), marker)
	}, waitFor, 5*time.Millisecond, "no rejection in the configured logger: %q", buf.String())
	assert.Contains(t, buf.String(), `"proxy-server"`, "the logger is named")
	assert.NotContains(t, global.String(), marker, "the line also went to klog's global logger")
}

// Metadata beyond server.GRPCMaxHeaderListSize is
// refused by the gRPC transport, before the handler runs, instead of
// gRPC's 16 MiB default.
func TestOversizedHandshakeHeadersAreRefused(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{})
	_, err := connectAgent(t, e, agentOpts{id: strings.Repeat("a", server.GRPCMaxHeaderListSize)})
	require.Error(t, err)
	assert.Zero(t, e.srv.Backends())
	// An agent with ordinary headers still connects.
	startAgent(t, e, agentOpts{id: "ok", identifiers: "host=node-1&ipv4=10.0.0.1"})
	waitBackends(t, e, 1)
}

// A gRPC frontend whose client cancels is freed at once
// although its receive loop is waiting for room in the queue of an agent
// that does not read, and its connection is closed at that agent (the
// CLOSE_REQ is queued behind what the agent has not read, without
// waiting).
func TestGRPCFrontendCancelFreedWhileAgentDoesNotRead(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	gauge := func(name string, labels map[string]string) func() float64 {
		return func() float64 { return metricValue(t, reg, name, labels) }
	}
	waiting := gauge("servercount_server_frontends_waiting_for_agent", nil)
	frontends := gauge("konnectivity_network_proxy_server_grpc_connections", map[string]string{"service_method": "Proxy"})
	established := gauge("konnectivity_network_proxy_server_established_connections", nil)

	// The agent answers one dial, then never reads again. The frontend
	// sends until the server's receive loop for it waits for room in the
	// agent's queue; Send blocks once the server stops receiving, and
	// fails when the stream is cancelled.
	_, cancel := floodAgent(t, e, "deaf", 256<<10)
	require.Eventually(t, func() bool { return waiting() == 1 }, waitFor, 5*time.Millisecond, "the frontend never waited for the agent")

	cancel()
	require.Eventually(t, func() bool { return frontends() == 0 && waiting() == 0 && established() == 0 },
		waitFor, 5*time.Millisecond, "the frontend was not freed")
	assert.Equal(t, 1, e.srv.Backends(), "the deaf agent stays connected")
}

// The CLOSE_REQ of a frontend that has gone is queued without waiting,
// but never overtakes the DATA queued before it: a client that writes and
// then closes has every byte delivered to the target.
func TestCloseAfterDataDeliversEveryByte(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	e, _ := startEnvAndAgent(t, server.Config{})

	lis := listen(t)
	received := make(chan int, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			received <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		received <- int(n)
	}()
	t.Cleanup(func() { lis.Close() })

	c, _, code := connectVia(t, e, http.MethodConnect, lis.Addr().String())
	require.Equal(t, http.StatusOK, code)
	_, err := c.Write(make([]byte, size))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	select {
	case n := <-received:
		assert.Equal(t, size, n, "bytes the target received before the close")
	case <-time.After(waitFor):
		t.Fatal("the target's connection was not closed")
	}
}

// When the peer refuses the server's certificate, the
// server says so, rather than that it refused the peer.
func TestTLSRefusedByPeerIsLoggedAsSuch(t *testing.T) {
	t.Parallel()
	serverCA, otherCA := newCA(t), newCA(t)
	srvCert, err := serverCA.Server("proxy-server")
	require.NoError(t, err)
	cliCert, err := serverCA.Client("agent")
	require.NoError(t, err)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}, ClientCAs: serverCA.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	gs := grpc.NewServer(append(server.GRPCServerOptions(), grpc.Creds(server.TLSCredentials(serverTLS, "agent", klog.Background())))...)
	lis := listen(t)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-served })
	log := logs.Capture(t)

	// The client trusts another CA: it refuses the server's certificate.
	c, err := net.DialTimeout("tcp", lis.Addr().String(), waitFor)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	tc := tls.Client(c, &tls.Config{Certificates: []tls.Certificate{cliCert.TLS}, RootCAs: otherCA.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12})
	require.Error(t, tc.Handshake())
	remote := fmt.Sprintf("remote=%q", c.LocalAddr().String())

	require.Eventually(t, func() bool {
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, remote) && strings.Contains(l, "Peer refused the TLS handshake") {
				return true
			}
		}
		return false
	}, waitFor, 5*time.Millisecond, "no log line saying the peer refused the handshake")
	assert.NotContains(t, log.String(), `"Refused TLS connection" err="remote error`)
}

// The header bound holds against a client that ignores
// the server's SETTINGS_MAX_HEADER_LIST_SIZE (grpc-go's own client checks
// it before sending, so the test speaks HTTP/2 itself): the stream is
// reset before the handler runs, where it used to be accepted.
func TestOversizedHeadersFromAHostileClientAreReset(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{})
	cfg := e.agentTLS.Clone()
	cfg.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: waitFor}
	c, err := tls.DialWithDialer(d, "tcp", e.agentAddr, cfg)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())

	block := adversarytest.ConnectHeaders(strings.Repeat("a", 2*server.GRPCMaxHeaderListSize), "")
	// The block goes in frames of the default 16 KiB maximum. The server
	// may close the connection before all is written: write from another
	// goroutine, and ignore write errors.
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		const maxFrame = 16 << 10
		b := block
		n := min(len(b), maxFrame)
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:n], EndHeaders: n == len(b)}) != nil {
			return
		}
		for b = b[n:]; len(b) > 0; {
			n := min(len(b), maxFrame)
			if fr.WriteContinuation(1, n == len(b), b[:n]) != nil {
				return
			}
			b = b[n:]
		}
	}()
	defer func() { c.Close(); <-writeDone }()

	// Refused: the stream is reset, or the connection is ended (GOAWAY,
	// or closed); accepted: the handler's response headers.
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server neither refused nor answered the stream")
			assert.Zero(t, e.srv.Backends())
			return
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			assert.Equal(t, uint32(1), f.StreamID)
			assert.Zero(t, e.srv.Backends())
			return
		case *http2.GoAwayFrame:
			assert.Zero(t, e.srv.Backends())
			return
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				t.Fatal("the server answered a stream with headers over the limit")
			}
		}
	}
}

// On the gRPC frontend too: a dial address no agent
// can dial is answered by the server, and no DIAL_REQ reaches the agent.
func TestGRPCFrontendRefusesInvalidAddresses(t *testing.T) {
	t.Parallel()
	e, a := startEnvAndAgent(t, server.Config{})
	for _, address := range []string{"/", "127.0.0.1", ":80", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http"} {
		t.Run(address, func(t *testing.T) {
			assert.Contains(t, rawDial(t, e, address), "invalid dial request: invalid target")
		})
	}
	assert.Zero(t, a.dials.Load(), "dial requests that reached the agent")
}
