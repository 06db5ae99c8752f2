package proxytest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// StopTimeout bounds every wait of the harness: an HTTP CONNECT
// handshake, the end of an agent's Run after Stop.
const StopTimeout = 10 * time.Second

// Env is a test PKI: one CA that signs the proxy-servers' certificates and
// the client certificates of agents and frontends, and that the servers
// require client certificates from.
type Env struct {
	// CA signs every certificate of the Env.
	CA *pkitest.CA
}

// NewEnv returns an Env with a fresh CA named name.
func NewEnv(tb testing.TB, name string) *Env {
	tb.Helper()
	ca, err := pkitest.NewCA(name)
	require.NoError(tb, err, "create test CA")
	return &Env{CA: ca}
}

// ServerTLS returns a server configuration with a certificate for
// localhost, 127.0.0.1, ::1 and names, that requires a client certificate
// signed by the Env's CA.
func (e *Env) ServerTLS(tb testing.TB, names ...string) *tls.Config {
	tb.Helper()
	pair, err := e.CA.Server("proxy-server", names...)
	require.NoError(tb, err, "issue server certificate")
	return &tls.Config{
		Certificates: []tls.Certificate{pair.TLS},
		ClientCAs:    e.CA.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

// ClientTLS returns a client configuration that trusts the Env's CA and
// presents a client certificate for cn.
func (e *Env) ClientTLS(tb testing.TB, cn string) *tls.Config {
	tb.Helper()
	pair, err := e.CA.Client(cn)
	require.NoError(tb, err, "issue client certificate")
	return &tls.Config{
		Certificates: []tls.Certificate{pair.TLS},
		RootCAs:      e.CA.Pool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// AgentDialOptions returns the gRPC dial options of an agent with a client
// certificate for cn, as cmd/proxy-agent builds them.
func (e *Env) AgentDialOptions(tb testing.TB, cn string) []grpc.DialOption {
	tb.Helper()
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(e.ClientTLS(tb, cn)))}
}

// ServerOptions configure [StartServer]. The zero value of each field
// means its default.
type ServerOptions struct {
	// ID is the server's ID; default "server-1".
	ID string
	// Count is sent to agents as serverCount; default
	// servercounter.StaticServerCounter(1).
	Count servercounter.ServerCounter
	// Strategies choose the agent of a dial; default server.StrategyDefault.
	Strategies []server.Strategy
	// Authenticator, if set, checks the agents' bearer tokens.
	Authenticator server.TokenAuthenticator
	// BackendDialTimeout bounds the wait for an agent's DIAL_RSP; default
	// server.DefaultBackendDialTimeout.
	BackendDialTimeout time.Duration
	// Heartbeat is server.Config.Heartbeat: 0 for the default, -1 for
	// none.
	Heartbeat time.Duration
	// Addr is the listen address of the agent port; default "127.0.0.1:0".
	// The frontend and health ports listen on port 0 of the same host, and
	// the server certificate names that host, so that servers can be put
	// on distinct loopback addresses such as "127.0.0.2:0".
	Addr string
	// Registry receives the server's metrics and is served on /metrics of
	// the health port; default a new registry, see [Server.Registry].
	Registry *prometheus.Registry
	// EditTLS, if set, may change the server's TLS configuration (every
	// port's) before the server starts, e.g. to count handshakes with
	// VerifyConnection.
	EditTLS func(*tls.Config)
	// FrontendWriteTimeout bounds the wait for a slow frontend; default
	// server.DefaultFrontendWriteTimeout.
	FrontendWriteTimeout time.Duration
	// TunnelWindow is server.Config.TunnelWindow: 0 for the default, -1
	// for no flow control.
	TunnelWindow int
	// AgentGRPCOptions are added to the agent port's gRPC server options,
	// e.g. a stream interceptor that counts Connect streams.
	AgentGRPCOptions []grpc.ServerOption
}

// Server is a proxy-server running in the test process: pkg/server behind
// a gRPC agent port (TLS, client certificate required), a gRPC
// ProxyService frontend (mTLS), an HTTP CONNECT frontend (mTLS) and a
// plain HTTP health port (/healthz, /readyz, /metrics).
type Server struct {
	tb          testing.TB
	id          string
	core        *server.Server
	reg         *prometheus.Registry
	frontendTLS *tls.Config // client side, for DialGRPC and DialHTTPConnect

	agentAddr, grpcAddr, connectAddr, healthAddr string

	agentGRPC, frontendGRPC *grpc.Server
	connectHTTP, healthHTTP *http.Server

	stopOnce sync.Once
	wg       sync.WaitGroup // the Serve goroutines
}

// StartServer starts a proxy-server as cmd/proxy-server wires it, on
// loopback ports, and registers its Stop with tb.Cleanup.
func StartServer(tb testing.TB, env *Env, opts ServerOptions) *Server {
	tb.Helper()
	if opts.ID == "" {
		opts.ID = "server-1"
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	host, _, err := net.SplitHostPort(opts.Addr)
	require.NoError(tb, err, "ServerOptions.Addr %q", opts.Addr)

	core, err := server.New(server.Config{
		ServerID:             opts.ID,
		Counter:              opts.Count,
		Strategies:           opts.Strategies,
		Authenticator:        opts.Authenticator,
		BackendDialTimeout:   opts.BackendDialTimeout,
		Heartbeat:            opts.Heartbeat,
		FrontendWriteTimeout: opts.FrontendWriteTimeout,
		TunnelWindow:         opts.TunnelWindow,
		Registerer:           opts.Registry,
	})
	require.NoError(tb, err, "create proxy-server")
	s := &Server{tb: tb, id: opts.ID, core: core, reg: opts.Registry, frontendTLS: env.ClientTLS(tb, "kube-apiserver")}

	serverTLS := env.ServerTLS(tb, host)
	if opts.EditTLS != nil {
		opts.EditTLS(serverTLS)
	}
	var ls []net.Listener
	for _, addr := range []string{opts.Addr, net.JoinHostPort(host, "0"), net.JoinHostPort(host, "0"), net.JoinHostPort(host, "0")} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			core.Close()
		}
		require.NoError(tb, err, "listen on %s", addr)
		ls = append(ls, l)
	}
	al, gl, cl, hl := ls[0], ls[1], ls[2], ls[3]
	s.agentAddr, s.grpcAddr, s.connectAddr, s.healthAddr = al.Addr().String(), gl.Addr().String(), cl.Addr().String(), hl.Addr().String()

	agentOpts := append(server.AgentGRPCServerOptions(), grpc.Creds(server.TLSCredentials(serverTLS, "agent", klog.Background())))
	s.agentGRPC = grpc.NewServer(append(agentOpts, opts.AgentGRPCOptions...)...)
	wire.RegisterAgentServiceServer(s.agentGRPC, core)
	s.frontendGRPC = grpc.NewServer(append(server.GRPCServerOptions(), grpc.Creds(server.TLSCredentials(serverTLS, "frontend", klog.Background())))...)
	client.RegisterProxyServiceServer(s.frontendGRPC, core)
	s.connectHTTP = &http.Server{Handler: core.HTTPConnect(), ReadHeaderTimeout: StopTimeout}
	health := http.NewServeMux()
	health.Handle("/metrics", serve.MetricsHandler(opts.Registry))
	health.Handle("/", core.Health())
	s.healthHTTP = &http.Server{Handler: health, ReadHeaderTimeout: StopTimeout}

	s.wg.Add(4)
	go func() { defer s.wg.Done(); _ = s.agentGRPC.Serve(core.AgentListener(al)) }()
	go func() { defer s.wg.Done(); _ = s.frontendGRPC.Serve(gl) }()
	go func() { defer s.wg.Done(); _ = s.connectHTTP.Serve(tls.NewListener(cl, serverTLS)) }()
	go func() { defer s.wg.Done(); _ = s.healthHTTP.Serve(hl) }()
	tb.Cleanup(s.Stop)
	return s
}

// ID returns the server's ID.
func (s *Server) ID() string { return s.id }

// Core returns the pkg/server Server.
func (s *Server) Core() *server.Server { return s.core }

// Registry returns the registry holding the server's metrics.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// AgentAddr is the host:port of the agent port.
func (s *Server) AgentAddr() string { return s.agentAddr }

// GRPCFrontendAddr is the host:port of the gRPC ProxyService frontend.
func (s *Server) GRPCFrontendAddr() string { return s.grpcAddr }

// HTTPConnectAddr is the host:port of the HTTP CONNECT frontend.
func (s *Server) HTTPConnectAddr() string { return s.connectAddr }

// HealthURL is the base URL of the health port, e.g.
// "http://127.0.0.1:4321"; append "/healthz", "/readyz" or "/metrics".
func (s *Server) HealthURL() string { return "http://" + s.healthAddr }

// Stop closes the pkg/server Server, which ends every agent stream,
// frontend stream and HTTP CONNECT tunnel, then stops the gRPC and HTTP
// servers and waits for them. It may be called more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.core.Close()
		s.agentGRPC.Stop()
		s.frontendGRPC.Stop()
		_ = s.connectHTTP.Close() // the error is the listener's: nothing to do about it
		_ = s.healthHTTP.Close()
		s.wg.Wait()
	})
}

// DialFunc opens a connection to addr through some path (a tunnel, or
// directly).
type DialFunc func(ctx context.Context, addr string) (net.Conn, error)

// DialGRPC opens a connection to addr through the server's gRPC frontend
// the way kube-apiserver does: a new single-use tunnel (its own gRPC
// connection, mTLS) per dial, made with the upstream konnectivity-client
// library. ctx bounds the dial; the connection then lives until it is
// closed, the tunnel breaks or the test ends.
//
// The returned connection is the library's: it has no deadlines, so a read
// blocks until data, EOF or the end of the test.
func (s *Server) DialGRPC(ctx context.Context, addr string) (net.Conn, error) {
	tunnel, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, s.tb.Context(), s.grpcAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(s.frontendTLS)))
	if err != nil {
		return nil, fmt.Errorf("create gRPC tunnel to proxy-server %s at %s: %w", s.id, s.grpcAddr, err)
	}
	conn, err := tunnel.DialContext(ctx, "tcp", addr)
	if err != nil {
		// A failed dial ends the tunnel (and its gRPC connection) by itself.
		return nil, fmt.Errorf("dial %s through proxy-server %s (gRPC): %w", addr, s.id, err)
	}
	return conn, nil
}

// ConnectError is the error of [Server.DialHTTPConnect] when the server
// answers the CONNECT with a status other than 200.
type ConnectError struct {
	// StatusCode is the HTTP status code, e.g. 502.
	StatusCode int
	// Body is the start of the response body: the server's reason.
	Body string
}

// Error implements error.
func (e *ConnectError) Error() string {
	return fmt.Sprintf("HTTP CONNECT refused: %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// DialHTTPConnect opens a connection to addr through the server's HTTP
// CONNECT frontend: an mTLS connection per dial, a CONNECT request and a
// 200 answer. A non-200 answer is returned as a *[ConnectError]. ctx
// bounds the dial only.
func (s *Server) DialHTTPConnect(ctx context.Context, addr string) (net.Conn, error) {
	d := tls.Dialer{Config: s.frontendTLS}
	c, err := d.DialContext(ctx, "tcp", s.connectAddr)
	if err != nil {
		return nil, fmt.Errorf("connect to proxy-server %s HTTP CONNECT port %s: %w", s.id, s.connectAddr, err)
	}
	conn, err := connectHandshake(ctx, c, addr)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("dial %s through proxy-server %s (HTTP CONNECT): %w", addr, s.id, err)
	}
	return conn, nil
}

// connectHandshake sends CONNECT addr on c and reads the answer, within
// ctx and StopTimeout.
func connectHandshake(ctx context.Context, c net.Conn, addr string) (net.Conn, error) {
	deadline := time.Now().Add(StopTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	// Cancelling ctx interrupts the blocked read or write.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr); err != nil {
		stop()
		return nil, ctxErr(ctx, err)
	}
	br := bufio.NewReader(c)
	rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		stop()
		return nil, ctxErr(ctx, err)
	}
	if rsp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(rsp.Body, 512)) // best effort: the status says enough
		stop()
		return nil, &ConnectError{StatusCode: rsp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if br.Buffered() == 0 {
		return c, nil
	}
	return &bufferedConn{Conn: c, r: br}, nil
}

// ctxErr prefers ctx's error to err once ctx is done.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// bufferedConn reads what a bufio.Reader already holds before the
// connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// DirectDial dials addr over plain TCP, for comparison with the tunnels.
func DirectDial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// HTTPClient returns an HTTP client whose connections are made by dial,
// without keep-alive, and whose idle connections are closed when the test
// ends.
func HTTPClient(tb testing.TB, dial DialFunc) *http.Client {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
		DisableKeepAlives: true,
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: StopTimeout}
}

// Agent is a proxy-agent running in the test process.
type Agent struct {
	tb     testing.TB
	cs     *agent.ClientSet
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result; read after done is closed
}

// StartAgent runs an agent.ClientSet built from cfg until Stop or the end
// of the test. When cfg has no DialOptions and is not Insecure, it gets TLS
// credentials from env with a client certificate for cfg.AgentID; when
// cfg.Registerer is nil, its metrics go to a new registry, see
// [Agent.Registry].
func StartAgent(tb testing.TB, env *Env, cfg agent.Config) *Agent {
	tb.Helper()
	if len(cfg.DialOptions) == 0 && !cfg.Insecure {
		cfg.DialOptions = env.AgentDialOptions(tb, cfg.AgentID)
	}
	a := &Agent{tb: tb, done: make(chan struct{})}
	if cfg.Registerer == nil {
		a.reg = prometheus.NewRegistry()
		cfg.Registerer = a.reg
	}
	cs, err := agent.NewClientSet(cfg)
	require.NoError(tb, err, "create agent")
	a.cs = cs
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() {
		defer close(a.done)
		a.err = cs.Run(ctx)
	}()
	tb.Cleanup(a.Stop)
	return a
}

// FastAgentConfig is agent.DefaultConfig with id and serverAddr and short
// intervals (sync 20 ms capped at 100 ms, probe 50 ms), so that tests see
// connections come and go quickly.
func FastAgentConfig(id, serverAddr string) agent.Config {
	cfg := agent.DefaultConfig()
	cfg.AgentID = id
	cfg.ServerAddress = serverAddr
	cfg.SyncInterval = 20 * time.Millisecond
	cfg.SyncIntervalCap = 100 * time.Millisecond
	cfg.ProbeInterval = 50 * time.Millisecond
	return cfg
}

// ClientSet returns the running agent.ClientSet.
func (a *Agent) ClientSet() *agent.ClientSet { return a.cs }

// Registry returns the registry StartAgent made for the agent's metrics,
// or nil if the Config had its own Registerer.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Stop ends the agent's Run, which closes its streams and endpoint
// connections, and waits for it. It may be called more than once.
func (a *Agent) Stop() {
	a.cancel()
	select {
	case <-a.done:
	case <-time.After(StopTimeout):
		a.tb.Errorf("proxytest: agent did not stop within %v", StopTimeout)
	}
}

// Err returns Run's error after Stop.
func (a *Agent) Err() error {
	select {
	case <-a.done:
		return a.err
	default:
		return errors.New("agent still running")
	}
}
