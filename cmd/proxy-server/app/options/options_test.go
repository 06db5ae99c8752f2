package options_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/flagtest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

func TestMain(m *testing.M) {
	defer os.RemoveAll(tlsDir)
	goleak.VerifyTestMain(m)
}

// tlsDir holds a CA (ca.crt) and a server certificate and key (s.crt,
// s.key): Validate reads them.
var tlsDir = func() string {
	dir, err := os.MkdirTemp("", "proxy-server-options-test")
	if err != nil {
		panic(err)
	}
	ca, err := pkitest.NewCA("options-test-ca")
	if err == nil {
		_, err = ca.WriteFile(dir, "ca")
	}
	var p *pkitest.Pair
	if err == nil {
		p, err = ca.Server("proxy-server")
	}
	if err == nil {
		_, _, err = p.WriteFiles(dir, "s")
	}
	if err != nil {
		panic(err)
	}
	return dir
}()

func tlsFile(name string) string { return filepath.Join(tlsDir, name) }

var tlsFlags = []string{
	"--cluster-cert=" + tlsFile("s.crt"), "--cluster-key=" + tlsFile("s.key"), "--cluster-ca-cert=" + tlsFile("ca.crt"),
	"--server-cert=" + tlsFile("s.crt"), "--server-key=" + tlsFile("s.key"), "--server-ca-cert=" + tlsFile("ca.crt"),
}

func TestValidate(t *testing.T) {
	t.Parallel()
	flagtest.Validate(t, options.NewOptions, []flagtest.Case{
		{Name: "tls", Args: tlsFlags},
		{Name: "insecure local", Args: []string{"--insecure-plaintext"}},
		{Name: "uds frontend needs no server certs", Args: []string{"--uds-name=/tmp/k.sock", "--cluster-cert=" + tlsFile("s.crt"), "--cluster-key=" + tlsFile("s.key")}},
		{Name: "http-connect", Args: append([]string{"--mode=http-connect"}, tlsFlags...)},
		{Name: "flow control off", Args: append([]string{"--tunnel-window=-1", "--frontend-write-timeout=1m"}, tlsFlags...)},
		{Name: "bad flow control", Args: append([]string{"--tunnel-window=-2", "--frontend-write-timeout=0"}, tlsFlags...),
			WantErr: []string{"invalid --frontend-write-timeout 0s: must be positive", "invalid --tunnel-window -2: want 1 to 1073741824 bytes, or -1 for no flow control"}},
		{Name: "no tls", Args: nil, WantErr: []string{"agents need TLS: set --cluster-cert and --cluster-key (", "the frontend port needs mTLS: set --server-cert, --server-key and --server-ca-cert, or"}},
		// Each error names what is missing, and only that.
		{Name: "cluster key missing", Args: []string{"--uds-name=/tmp/k.sock", "--cluster-cert=" + tlsFile("s.crt")}, WantErr: []string{"agents need TLS: set --cluster-key (or --insecure-plaintext"}},
		{Name: "server CA missing", Args: []string{"--cluster-cert=" + tlsFile("s.crt"), "--cluster-key=" + tlsFile("s.key"), "--server-cert=" + tlsFile("s.crt"), "--server-key=" + tlsFile("s.key")}, WantErr: []string{"the frontend port needs mTLS: set --server-ca-cert, or"}},
		{Name: "missing files name their flags", Args: append(append([]string(nil), tlsFlags...), "--server-cert=/nonexistent/s.crt", "--cluster-ca-cert=/nonexistent/ca.crt"),
			WantErr: []string{"--server-cert: stat /nonexistent/s.crt: no such file or directory", "--cluster-ca-cert: stat /nonexistent/ca.crt: no such file or directory"}},
		{Name: "files that do not parse name their flags", Args: append(append([]string(nil), tlsFlags...), "--cluster-key="+tlsFile("ca.crt"), "--server-ca-cert="+tlsFile("s.key")),
			WantErr: []string{"--server-ca-cert: CA bundle " + tlsFile("s.key") + ": no PEM certificate in it", "--cluster-cert and --cluster-key: certificate " + tlsFile("s.crt") + " and key " + tlsFile("ca.crt")}},
		{Name: "insecure with tls files", Args: []string{"--insecure-plaintext", "--server-cert=/nonexistent/s.crt"}, WantErr: []string{"--insecure-plaintext serves without TLS, so --server-cert would be ignored: drop it or --insecure-plaintext"}},
		{Name: "bad mode", Args: append([]string{"--mode=socks"}, tlsFlags...), WantErr: []string{`invalid --mode "socks": use grpc or http-connect`}},
		{Name: "zero servers", Args: append([]string{"--server-count=0"}, tlsFlags...), WantErr: []string{"invalid --server-count 0: must be at least 1"}},
		{Name: "bad strategy", Args: append([]string{"--proxy-strategies=destHost,nearest"}, tlsFlags...), WantParseErr: `invalid argument "destHost,nearest" for "--proxy-strategies" flag: unknown proxy strategy "nearest"`},
		{Name: "token review", Args: append([]string{"--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent", "--authentication-audience=system:konnectivity-server"}, tlsFlags...)},
		{Name: "service account alone", Args: append([]string{"--agent-service-account=konnectivity-agent"}, tlsFlags...), WantErr: []string{"--agent-namespace and --agent-service-account go together"}},
		{Name: "two token checks", Args: append([]string{"--agent-namespace=a", "--agent-service-account=b", "--agent-token-file=" + tlsFile("s.key")}, tlsFlags...), WantErr: []string{"--agent-token-file and --agent-service-account exclude each other"}},
		{Name: "missing token file", Args: append([]string{"--agent-token-file=/nonexistent/tokens"}, tlsFlags...), WantErr: []string{"--agent-token-file: stat /nonexistent/tokens: no such file or directory"}},
		{Name: "audience without service account", Args: append([]string{"--authentication-audience=x"}, tlsFlags...), WantErr: []string{"--authentication-audience needs --agent-namespace"}},
		{Name: "kubeconfig for nothing", Args: append([]string{"--kubeconfig=" + tlsFile("s.key")}, tlsFlags...), WantErr: []string{"--kubeconfig needs --agent-namespace and --agent-service-account, or --enable-lease-controller"}},
		{Name: "leases", Args: append([]string{"--enable-lease-controller", "--kubeconfig=" + tlsFile("s.key"), "--lease-namespace=ns", "--lease-label=app=proxy,tier=cp"}, tlsFlags...)},
		{Name: "bad lease label", Args: append([]string{"--enable-lease-controller", "--lease-label=app"}, tlsFlags...), WantErr: []string{`invalid --lease-label "app"`}},
		{Name: "tls policy", Args: append([]string{"--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "--tls-min-version=VersionTLS13"}, tlsFlags...)},
		{Name: "bad cipher suite", Args: append([]string{"--cipher-suites=TLS_NULL"}, tlsFlags...), WantParseErr: `invalid argument "TLS_NULL" for "--cipher-suites" flag: unknown cipher suite "TLS_NULL"`},
		{Name: "bad tls version", Args: append([]string{"--tls-min-version=1.3"}, tlsFlags...), WantParseErr: `invalid argument "1.3" for "--tls-min-version" flag: unknown TLS version "1.3"`},
		{Name: "bad port", Args: append([]string{"--agent-port=99999"}, tlsFlags...), WantErr: []string{"invalid --agent-port 99999"}},
		{Name: "liveness", Args: append([]string{"--keepalive-time=1m", "--keepalive-timeout=5s", "--heartbeat-interval=1s", "--unanswered-dial-timeout=3s", "--backend-dial-timeout=0"}, tlsFlags...)},
		{Name: "binding with certificates", Args: append([]string{"--bind-agent-identifiers"}, tlsFlags...)},
		{Name: "binding with nothing to prove", Args: []string{"--bind-agent-identifiers", "--insecure-plaintext"}, WantErr: []string{"--bind-agent-identifiers needs a credential that proves an agent's node"}},
		{Name: "binding with a token file", Args: append([]string{"--bind-agent-identifiers", "--agent-token-file=" + tlsFile("s.key")}, tlsFlags...), WantErr: []string{"--bind-agent-identifiers needs a credential that proves an agent's node"}},
		{Name: "bad review rate", Args: append([]string{"--token-review-qps=0", "--token-review-burst=0"}, tlsFlags...), WantErr: []string{"invalid --token-review-qps 0 or --token-review-burst 0: the rate must be positive and the burst at least 1"}},
		{Name: "bad handshake bound", Args: append([]string{"--max-agent-handshakes-per-address=-1"}, tlsFlags...), WantErr: []string{"invalid --max-agent-handshakes-per-address -1: must not be negative"}},
		{Name: "bad liveness", Args: append([]string{"--keepalive-timeout=0", "--heartbeat-interval=2h", "--unanswered-dial-timeout=-1s", "--frontend-keepalive-time=0"}, tlsFlags...),
			WantErr: []string{"invalid --keepalive-timeout 0s: must be positive", "invalid --heartbeat-interval 2h0m0s", "--unanswered-dial-timeout", "invalid --frontend-keepalive-time 0s: must be positive"}},
	})
}

func TestDefaultsAreUpstreams(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	assert.Equal(t, 1, o.ServerCount)
	assert.Equal(t, 8090, o.ServerPort)
	assert.Equal(t, 8091, o.AgentPort)
	assert.Equal(t, 8092, o.HealthPort)
	assert.Equal(t, 8095, o.AdminPort)
	assert.Equal(t, "grpc", o.Mode)
	assert.Equal(t, []server.Strategy{server.StrategyDefault}, o.ProxyStrategies)
	assert.NotEmpty(t, o.ServerID)
	assert.NotEqual(t, o.ServerID, options.NewOptions().ServerID, "a random ID per server")
}

// --insecure-plaintext listens on loopback unless a
// bind address says otherwise; with TLS, an empty address means all
// interfaces, as upstream.
func TestListenHosts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		args                    []string
		wantAgent, wantFrontend string
	}{
		{name: "insecure", args: []string{"--insecure-plaintext"}, wantAgent: "127.0.0.1", wantFrontend: "127.0.0.1"},
		{name: "insecure with addresses", args: []string{"--insecure-plaintext", "--agent-bind-address=0.0.0.0", "--server-bind-address=::1"}, wantAgent: "0.0.0.0", wantFrontend: "::1"},
		{name: "tls", args: tlsFlags, wantAgent: "", wantFrontend: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := options.NewOptions()
			require.NoError(t, o.Flags().Parse(tc.args))
			require.Empty(t, o.Validate())
			cfg := o.Config()
			assert.Equal(t, tc.wantAgent, cfg.Agents.Host, "agent port")
			assert.Equal(t, tc.wantFrontend, cfg.Frontends.Host, "frontend port")
		})
	}
}

// Config is data: whatever the flags ask for (DNS, TokenReviews and
// leases at an API server that is not there, TLS files), it starts
// nothing and reaches nothing, so that a failure after it leaves nothing
// to stop. It runs alone (not in parallel), so that any goroutine it
// finds is Config's.
func TestConfig(t *testing.T) {
	o := options.NewOptions()
	require.NoError(t, o.Flags().Parse(append([]string{
		"--server-id=s1", "--server-count=3", "--stream-stall-timeout=0", "--max-agent-handshakes-per-address=0",
		"--server-count-dns=proxy.example.", "--server-count-dns-server=127.0.0.1:1",
		"--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent", "--authentication-audience=aud",
		"--token-review-qps=250", "--token-review-burst=20", "--bind-agent-identifiers",
		"--enable-lease-controller", "--kubeconfig=" + tlsFile("s.key"),
	}, tlsFlags...)))
	require.Empty(t, o.Validate())

	before := goleak.IgnoreCurrent()
	cfg := o.Config()
	goleak.VerifyNone(t, before)

	assert.Equal(t, "s1", cfg.Server.ServerID)
	assert.Equal(t, 3, cfg.Server.Counter.CountServers(), "--server-count until app.New adds DNS")
	assert.Equal(t, time.Duration(-1), cfg.Server.StreamStallTimeout, "the flag's 0 is never")
	assert.Equal(t, -1, cfg.Server.MaxHandshakesPerAddress, "the flag's 0 is no bound per address")
	assert.Equal(t, server.DefaultBackendDialTimeout, cfg.Server.BackendDialTimeout)
	assert.Equal(t, server.DefaultUnansweredDialTimeout, cfg.Server.UnansweredDialTimeout)
	assert.Equal(t, wire.DefaultHeartbeat, cfg.Server.Heartbeat)
	assert.Equal(t, options.DefaultKeepaliveTime, cfg.KeepaliveTime)
	assert.Equal(t, options.DefaultKeepaliveTimeout, cfg.KeepaliveTimeout)
	assert.Nil(t, cfg.Server.Authenticator, "app.New builds the authenticator")
	assert.Same(t, o.DNS, cfg.DNS)
	assert.Same(t, o.Leases, cfg.Leases)
	require.NotNil(t, cfg.TokenReview)
	assert.Equal(t, "aud", cfg.TokenReview.Audience)
	assert.Equal(t, 250.0, cfg.TokenReview.QPS)
	assert.Equal(t, 20, cfg.TokenReview.Burst)
	assert.True(t, cfg.Server.BindIdentifiers)
	assert.Nil(t, cfg.TokenReview.Client, "app.New builds the client")
	require.NotNil(t, cfg.AgentTLS)
	require.NotNil(t, cfg.FrontendTLS)
	assert.Equal(t, tlsFile("ca.crt"), cfg.FrontendTLS.CA)
	assert.Equal(t, 8091, cfg.Agents.Port)
}

// --help shows one default for --server-id, not the
// usage's "random" and this process's draw.
func TestHelpShowsOneServerIDDefault(t *testing.T) {
	t.Parallel()
	line := flagtest.Usage(t, options.NewOptions().Flags(), "--server-id")
	require.NotEmpty(t, line)
	assert.Equal(t, 1, strings.Count(line, "default"), line)
}

// Upstream's server gained --frontend-write-channel-size after
// the commit the oracle is built from; an upstream manifest that sets it
// starts ours, which says at start-up that it has no effect.
func TestNewerUpstreamFlagIsAcceptedAndReported(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	fs := o.Flags()
	require.NoError(t, fs.Parse(append([]string{"--frontend-write-channel-size=0"}, tlsFlags...)))
	assert.Empty(t, o.Validate())
	assert.Equal(t, []string{"--frontend-write-channel-size"}, serve.IgnoredFlags(fs))
}
