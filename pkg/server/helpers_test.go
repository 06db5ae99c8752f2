package server_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/logtest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// logs receives klog's output for the whole test binary; tests capture
// it with logs.Capture.
var logs = logtest.KlogTee(os.Stderr)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// settableCounter is a servercounter.ServerCounter whose value the test
// changes.
type settableCounter struct{ n atomic.Int64 }

func (c *settableCounter) CountServers() int { return int(c.n.Load()) }

// env is one Server with its listeners: the agent port (mTLS), the gRPC
// frontend port (mTLS), the HTTP CONNECT port and the health port.
type env struct {
	ca                                       *pkitest.CA
	srv                                      *server.Server
	agentAddr, frontAddr, connectAddr, hzURL string
	agentTLS, frontTLS                       *tls.Config // client-side configs
}

func newCA(t testing.TB) *pkitest.CA {
	t.Helper()
	ca, err := pkitest.NewCA("test-ca")
	require.NoError(t, err)
	return ca
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return lis
}

// startEnv starts a Server configured by cfg (ServerID defaults to "s1").
func startEnv(t testing.TB, cfg server.Config) *env {
	t.Helper()
	if cfg.ServerID == "" {
		cfg.ServerID = "s1"
	}
	srv, err := server.New(cfg)
	require.NoError(t, err)
	ca := newCA(t)
	srvCert, err := ca.Server("proxy-server")
	require.NoError(t, err)
	cliCert, err := ca.Client("client")
	require.NoError(t, err)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{srvCert.TLS}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	clientTLS := &tls.Config{Certificates: []tls.Certificate{cliCert.TLS}, RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}

	e := &env{ca: ca, srv: srv, agentTLS: clientTLS, frontTLS: clientTLS}

	agentLis, frontLis, connectLis, hzLis := listen(t), listen(t), listen(t), listen(t)
	e.agentAddr, e.frontAddr, e.connectAddr = agentLis.Addr().String(), frontLis.Addr().String(), connectLis.Addr().String()
	e.hzURL = "http://" + hzLis.Addr().String()

	agentGRPC := grpc.NewServer(append(server.AgentGRPCServerOptions(), grpc.Creds(credentials.NewTLS(serverTLS)))...)
	wire.RegisterAgentServiceServer(agentGRPC, srv)
	frontGRPC := grpc.NewServer(append(server.GRPCServerOptions(), grpc.Creds(credentials.NewTLS(serverTLS)))...)
	client.RegisterProxyServiceServer(frontGRPC, srv)
	connectHTTP := &http.Server{Handler: srv.HTTPConnect(), ReadHeaderTimeout: waitFor}
	hzHTTP := &http.Server{Handler: srv.Health(), ReadHeaderTimeout: waitFor}

	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); _ = agentGRPC.Serve(srv.AgentListener(agentLis)) }()
	go func() { defer wg.Done(); _ = frontGRPC.Serve(frontLis) }()
	go func() { defer wg.Done(); _ = connectHTTP.Serve(connectLis) }()
	go func() { defer wg.Done(); _ = hzHTTP.Serve(hzLis) }()
	t.Cleanup(func() {
		srv.Close()
		agentGRPC.Stop()
		frontGRPC.Stop()
		_ = connectHTTP.Close()
		_ = hzHTTP.Close()
		wg.Wait()
	})
	return e
}

// tokenFileAuth returns the authenticator of a token file that holds
// tokens.
func tokenFileAuth(t *testing.T, tokens string) server.TokenAuthenticator {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(tokens), 0o600))
	auth, err := server.NewTokenFileAuthenticator(path)
	require.NoError(t, err)
	return auth
}

// testAgent stands in for pkg/agent: an adversarytest.DeafAgent made to hear,
// which dials what it is asked to and relays DATA.
type testAgent struct {
	*adversarytest.DeafAgent
	t       testing.TB
	dials   atomic.Int64
	closeCh chan int64 // CLOSE_REQ connectIDs received; buffered, extra dropped
	done    chan struct{}
	wg      sync.WaitGroup

	mu     sync.Mutex
	conns  map[int64]net.Conn // guarded by mu
	nextID int64              // guarded by mu
}

// agentOpts are the handshake metadata of a test agent, and how
// startAgent's agent answers dials.
type agentOpts struct {
	id, identifiers, token string
	extraMD                []string // appended as key, value pairs
	// answer, if set, answers each DIAL_REQ with the connectID it
	// returns, without dialing.
	answer func(*client.DialRequest) int64
}

// connectAgent opens an agent's stream, which reads nothing until the test
// makes it, and returns it with the handshake's error. The stream ends
// with the test.
func connectAgent(t testing.TB, e *env, o agentOpts) (*adversarytest.DeafAgent, error) {
	t.Helper()
	a, err := adversarytest.DialDeafAgent(context.Background(), adversarytest.AgentConfig{
		Addr: e.agentAddr, TLS: e.agentTLS,
		ID: o.id, Identifiers: o.identifiers, Token: o.token, Metadata: o.extraMD,
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(a.Close)
	return a, nil
}

// startAgent connects and serves an agent until the test ends.
func startAgent(t testing.TB, e *env, o agentOpts) *testAgent {
	t.Helper()
	da, err := connectAgent(t, e, o)
	require.NoError(t, err)
	return serveDeafAgent(t, da, o.answer)
}

// serveDeafAgent serves the stream of da as a test agent until the test
// ends; answer is as agentOpts.answer (nil: dial).
func serveDeafAgent(t testing.TB, da *adversarytest.DeafAgent, answer func(*client.DialRequest) int64) *testAgent {
	a := &testAgent{DeafAgent: da, t: t, closeCh: make(chan int64, 1024), done: make(chan struct{}), conns: map[int64]net.Conn{}}
	go a.serve(answer)
	t.Cleanup(a.stop)
	return a
}

// startEnvAndAgent starts a Server configured by cfg, as startEnv does,
// and one agent, "a1", and waits until the Server has its stream.
func startEnvAndAgent(t testing.TB, cfg server.Config) (*env, *testAgent) {
	t.Helper()
	e := startEnv(t, cfg)
	a := startAgent(t, e, agentOpts{id: "a1"})
	waitBackends(t, e, 1)
	return e, a
}

// stop ends the agent's stream and waits for its goroutines.
func (a *testAgent) stop() {
	a.Close()
	<-a.done
}

func (a *testAgent) send(p *client.Packet) {
	_ = a.Send(p)
}

func (a *testAgent) drain() {
	a.send(wire.Drain())
}

// drainAndSync sends DRAIN and waits until the server has processed it:
// it then sends a DIAL_RSP for no pending dial, which the server answers
// with CLOSE_REQ, after DRAIN since a stream's packets are handled in
// order.
func (a *testAgent) drainAndSync(t *testing.T) {
	t.Helper()
	const marker = 1 << 40
	a.drain()
	a.send(dialRsp(-1, marker, ""))
	for {
		select {
		case id := <-a.closeCh:
			if id == marker {
				return
			}
		case <-time.After(waitFor):
			t.Fatal("server did not answer the DRAIN marker")
		}
	}
}

func (a *testAgent) serve(answer func(*client.DialRequest) int64) {
	defer close(a.done)
	defer a.wg.Wait()
	defer func() {
		a.mu.Lock()
		for id, c := range a.conns {
			c.Close()
			delete(a.conns, id)
		}
		a.mu.Unlock()
	}()
	for {
		pkt, err := a.Recv()
		if err != nil {
			return
		}
		switch pkt.GetType() {
		case client.PacketType_DIAL_REQ:
			a.dials.Add(1)
			req := pkt.GetDialRequest()
			if answer != nil {
				a.send(dialRsp(req.GetRandom(), answer(req), ""))
				continue
			}
			// Tests reach only this machine: refuse anything but a
			// loopback address, without resolving names.
			if host, _, err := net.SplitHostPort(req.GetAddress()); err != nil || !isLoopback(host) {
				a.send(dialRsp(req.GetRandom(), 0, "test agent dials only loopback addresses"))
				continue
			}
			c, err := net.DialTimeout("tcp", req.GetAddress(), 5*time.Second)
			if err != nil {
				a.send(dialRsp(req.GetRandom(), 0, err.Error()))
				continue
			}
			a.mu.Lock()
			a.nextID++
			id := a.nextID
			a.conns[id] = c
			a.mu.Unlock()
			a.send(dialRsp(req.GetRandom(), id, ""))
			a.wg.Add(1)
			go a.readConn(id, c)
		case client.PacketType_DATA:
			d := pkt.GetData()
			a.mu.Lock()
			c := a.conns[d.GetConnectID()]
			a.mu.Unlock()
			if c == nil {
				a.send(closeRsp(d.GetConnectID(), "unknown connectID"))
				continue
			}
			_, _ = c.Write(d.GetData())
		case client.PacketType_CLOSE_REQ:
			id := pkt.GetCloseRequest().GetConnectID()
			select {
			case a.closeCh <- id:
			default:
			}
			a.mu.Lock()
			c := a.conns[id]
			delete(a.conns, id)
			a.mu.Unlock()
			if c != nil {
				c.Close()
				a.send(closeRsp(id, ""))
			} else {
				a.send(closeRsp(id, "unknown connectID"))
			}
		}
	}
}

func (a *testAgent) readConn(id int64, c net.Conn) {
	defer a.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			a.send(wire.Data(id, append([]byte(nil), buf[:n]...)))
		}
		if err != nil {
			break
		}
	}
	a.mu.Lock()
	mine := a.conns[id] == c
	delete(a.conns, id)
	a.mu.Unlock()
	c.Close()
	if mine {
		a.send(closeRsp(id, ""))
	}
}

func isLoopback(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func dialRsp(random, id int64, errText string) *client.Packet {
	return wire.DialRsp(random, id, errText)
}

func closeRsp(id int64, errText string) *client.Packet {
	return wire.CloseRsp(id, errText)
}

// waitReady waits until the Server has n agent streams.
func waitBackends(t testing.TB, e *env, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return e.srv.Backends() == n }, waitFor, 5*time.Millisecond, "want %d agent streams", n)
}

// serveConns starts a TCP server on loopback that runs handle for each
// connection in its own goroutine, and returns its address. When the test
// ends it closes the listener and every connection, and waits for the
// handlers.
func serveConns(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	lis := listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

// echoServer starts a TCP server that sends back what it reads.
func echoServer(t testing.TB) string {
	t.Helper()
	return serveConns(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// tunnelThroughAgent connects a deaf agent named id and opens a tunnel
// through it to a dummy address from a deaf gRPC frontend: the agent
// answers the one dial (connectID 1), and then reads only when the test
// makes it. The frontend's stream ends with ctx.
func tunnelThroughAgent(t *testing.T, ctx context.Context, e *env, id string) (*adversarytest.DeafAgent, *adversarytest.DeafFrontend) {
	t.Helper()
	a, err := connectAgent(t, e, agentOpts{id: id})
	require.NoError(t, err)
	waitBackends(t, e, 1)

	f, err := adversarytest.DialDeafFrontend(ctx, adversarytest.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
	require.NoError(t, err)
	t.Cleanup(f.Close)
	dialThrough(t, a, f, 7, 1)
	return a, f
}

// dialThrough dials through frontend f with dial ID random and has agent
// a accept the dial as connectID.
func dialThrough(t *testing.T, a *adversarytest.DeafAgent, f *adversarytest.DeafFrontend, random, connectID int64) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() { _, err := a.AcceptDial(connectID); accepted <- err }()
	got, err := f.Dial("127.0.0.1:9", random)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	require.Equal(t, connectID, got)
}

// floodAgent opens a tunnel through a deaf agent named id, as
// tunnelThroughAgent does, and sends the agent chunk-byte DATA from the
// frontend until the stream fails: once the agent's HTTP/2 window and
// queue are full, the server's writer to it waits in Send. stop ends the
// frontend's stream and waits for the sender; it also runs when the test
// ends.
func floodAgent(t *testing.T, e *env, id string, chunk int) (a *adversarytest.DeafAgent, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	a, stream := tunnelThroughAgent(t, ctx, e, id)
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		data := make([]byte, chunk)
		for stream.Send(wire.Data(1, data)) == nil {
		}
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-sendDone
	})
	t.Cleanup(stop)
	return a, stop
}

// queueBound is the most bytes a queue may hold: QueueSize pieces of
// MaxDataPayload, plus the one being sent.
const queueBound = (server.QueueSize + 1) * wire.MaxDataPayload

// queuedBytesWatch reads servercount_server_queued_bytes from reg and
// remembers the highest value read: queued may be called from
// Eventually's goroutine, where require must not stop the test, and
// check fails the test if that highest value passed queueBound.
func queuedBytesWatch(t *testing.T, reg *prometheus.Registry) (queued func() float64, check func()) {
	var mu sync.Mutex
	highest := 0.0
	queued = func() float64 {
		v, _ := metricstest.Value(reg, "servercount_server_queued_bytes")
		mu.Lock()
		highest = max(highest, v)
		mu.Unlock()
		return v
	}
	check = func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.LessOrEqual(t, highest, float64(queueBound), "a queue held more than (QueueSize+1) x MaxDataPayload bytes")
	}
	return queued, check
}

// gaugeOf reads a gauge from reg, 0 when the series does not exist (a
// labelled series exists only once it has been used). It never fails the
// test, so that it may run in require.Eventually's goroutine.
func gaugeOf(reg *prometheus.Registry, name string, labels map[string]string) func() float64 {
	var kv []string
	for k, v := range labels {
		kv = append(kv, k, v)
	}
	return func() float64 {
		v, _ := metricstest.Value(reg, name, kv...)
		return v
	}
}
