package options_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/flagtest"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// upstreamFlags is how tools written for the upstream agent start it: every
// flag of its option set, as --name=value.
var upstreamFlags = []string{
	"--admin-bind-address=127.0.0.1", "--admin-server-port=8094", "--agent-cert=/c/agent.crt", "--agent-id=a1",
	"--agent-identifiers=", "--agent-key=/c/agent.key", "--alpn-proto=[]", "--ca-cert=/c/ca.crt",
	"--count-server-leases=false", "--enable-contention-profiling=false", "--enable-profiling=false",
	"--health-server-host=", "--health-server-port=8093", "--keepalive-time=1h0m0s",
	"--kube-api-content-type=application/vnd.kubernetes.protobuf", "--kubeconfig=",
	"--lease-label=k8s-app=konnectivity-server", "--lease-label-selector=k8s-app=konnectivity-server",
	"--lease-namespace=kube-system", "--probe-interval=1s", "--proxy-server-host=konnectivity.example",
	"--proxy-server-port=8091", "--server-count-source=default", "--service-account-token-path=",
	"--sync-forever=false", "--sync-interval=1s", "--sync-interval-cap=10s", "--warn-on-channel-limit=false",
	"--xfr-channel-size=150",
}

// tlsFiles writes a CA, and an agent certificate and key it signed, and
// returns the three paths.
func tlsFiles(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	c, err := pkitest.NewCA("options-test-ca")
	require.NoError(t, err)
	ca, err = c.WriteFile(dir, "ca")
	require.NoError(t, err)
	p, err := c.Client("proxy-agent")
	require.NoError(t, err)
	cert, key, err = p.WriteFiles(dir, "agent")
	require.NoError(t, err)
	return ca, cert, key
}

func TestAcceptsEveryUpstreamFlag(t *testing.T) {
	t.Parallel()
	ca, cert, key := tlsFiles(t)
	args := strings.NewReplacer("/c/ca.crt", ca, "/c/agent.crt", cert, "/c/agent.key", key)
	var flags []string
	for _, f := range upstreamFlags {
		flags = append(flags, args.Replace(f))
	}
	o := options.NewOptions()
	fs := o.Flags()
	require.NoError(t, fs.Parse(flags))
	assert.Empty(t, o.Validate())
	assert.Equal(t, "konnectivity.example", o.ProxyServerHost)
	assert.Empty(t, o.ALPN(), `"[]" is pflag's printing of an empty slice`)
	require.NoError(t, fs.Parse([]string{"--alpn-proto=h2,konnectivity"}))
	assert.Equal(t, []string{"h2", "konnectivity"}, o.ALPN())
}

func TestValidate(t *testing.T) {
	t.Parallel()
	flagtest.Validate(t, options.NewOptions, []flagtest.Case{
		{Name: "defaults", Args: nil},
		{Name: "insecure", Args: []string{"--insecure-plaintext"}},
		{Name: "leases", Args: []string{"--count-server-leases", "--lease-namespace=ns", "--lease-label-selector=app=proxy"}},
		{Name: "leases with a bad selector", Args: []string{"--count-server-leases", "--lease-label-selector=a b"}, WantErr: []string{`invalid --lease-label-selector "a b"`}},
		{Name: "cert without key", Args: []string{"--agent-cert=/c/a.crt"}, WantErr: []string{"--agent-cert and --agent-key go together"}},
		{Name: "cap below interval", Args: []string{"--sync-interval=5s", "--sync-interval-cap=1s"}, WantErr: []string{"--sync-interval-cap 1s must be at least --sync-interval 5s"}},
		{Name: "bad source", Args: []string{"--server-count-source=leases"}, WantParseErr: `invalid argument "leases" for "--server-count-source" flag: use default or max`},
		{Name: "bad identifiers", Args: []string{"--agent-identifiers=default-route=maybe"}, WantParseErr: `invalid argument "default-route=maybe" for "--agent-identifiers" flag`},
		{Name: "bad port", Args: []string{"--health-server-port=70000"}, WantErr: []string{"invalid --health-server-port 70000"}},
		{Name: "dns counting", Args: []string{"--server-count-dns=proxy.kube-system.svc.cluster.local", "--server-dial-mode=resolved", "--server-count-source=max"}},
		{Name: "resolved needs dns", Args: []string{"--server-dial-mode=resolved"}, WantErr: []string{"--server-dial-mode=resolved needs --server-count-dns"}},
		{Name: "bad dial mode", Args: []string{"--server-dial-mode=nearest"}, WantParseErr: `invalid argument "nearest" for "--server-dial-mode" flag: unknown server dial mode`},
		{Name: "bad dns type", Args: []string{"--server-count-dns=x.example", "--server-count-dns-type=mx"}, WantParseErr: `invalid argument "mx" for "--server-count-dns-type" flag: use auto, srv, a, aaaa or ip`},
		{Name: "dial bounds", Args: []string{"--max-concurrent-dials=0", "--max-tunnels-per-server=-1"},
			WantErr: []string{"invalid --max-concurrent-dials 0: must be at least 1", "invalid --max-tunnels-per-server -1: must be at least 1"}},
		{Name: "negative drain timeout", Args: []string{"--drain-timeout=-1s"}, WantErr: []string{"invalid --drain-timeout -1s"}},
		{Name: "flow control off", Args: []string{"--tunnel-window=-1", "--endpoint-write-timeout=1m"}},
		{Name: "bad flow control", Args: []string{"--tunnel-window=0", "--endpoint-write-timeout=0"},
			WantErr: []string{"invalid --tunnel-window 0: want 1 to 1073741824 bytes, or -1 for no flow control", "invalid --endpoint-write-timeout 0s: must be positive"}},
		{Name: "negative hold-down", Args: []string{"--server-count-hold-down=-1s"}, WantErr: []string{"invalid --server-count-hold-down"}},
		{Name: "liveness", Args: []string{"--keepalive-time=40s", "--keepalive-timeout=10s", "--heartbeat-interval=2s"}},
		{Name: "heartbeats off", Args: []string{"--heartbeat-interval=0"}},
		{Name: "bad liveness", Args: []string{"--keepalive-time=0", "--keepalive-timeout=-1s", "--heartbeat-interval=5ms"},
			WantErr: []string{"invalid --keepalive-time 0s: must be positive", "invalid --keepalive-timeout -1s: must be positive", "invalid --heartbeat-interval 5ms: want 10ms to 1h0m0s, or 0 to send and expect none"}},
		{Name: "readiness", Args: []string{"--readiness-all-servers", "--readiness-grace-period=0"}},
		{Name: "negative readiness grace", Args: []string{"--readiness-all-servers", "--readiness-grace-period=-1s"}, WantErr: []string{"invalid --readiness-grace-period -1s: must not be negative"}},
		{Name: "every problem at once", Args: []string{"--agent-id=", "--proxy-server-host=", "--probe-interval=0s"},
			WantErr: []string{"--agent-id must not be empty", "--proxy-server-host must not be empty", "must be positive"}},
	})
}

// A missing certificate file is refused by Validate, naming its flag.
func TestValidateNamesMissingCertificateFiles(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	require.NoError(t, o.Flags().Parse([]string{"--ca-cert=/nonexistent/ca.crt", "--agent-cert=/nonexistent/a.crt", "--agent-key=/nonexistent/a.key"}))
	errs := o.Validate()
	require.Len(t, errs, 3)
	assert.ErrorContains(t, errs[0], "--agent-cert: stat /nonexistent/a.crt: no such file or directory")
	assert.ErrorContains(t, errs[1], "--agent-key: stat /nonexistent/a.key: no such file or directory")
	assert.ErrorContains(t, errs[2], "--ca-cert: stat /nonexistent/ca.crt: no such file or directory")

	// Files that exist but do not parse are refused too, naming their flags.
	ca, cert, key := tlsFiles(t)
	o = options.NewOptions()
	require.NoError(t, o.Flags().Parse([]string{"--ca-cert=" + key, "--agent-cert=" + cert, "--agent-key=" + ca}))
	errs = o.Validate()
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[0], "--agent-cert and --agent-key: certificate "+cert+" and key "+ca)
	assert.ErrorContains(t, errs[1], "--ca-cert: CA bundle "+key+": no PEM certificate in it")

	o = options.NewOptions()
	require.NoError(t, o.Flags().Parse([]string{"--ca-cert=" + ca, "--agent-cert=" + cert, "--agent-key=" + key}))
	assert.Empty(t, o.Validate())
}

// --help shows one default for --agent-id, not "(default: random)" and
// this run's random ID beside it.
func TestHelpShowsOneDefaultForAgentID(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	require.NotEmpty(t, o.AgentID, "the default ID is random")
	line := flagtest.Usage(t, o.Flags(), "--agent-id")
	assert.Equal(t, 1, strings.Count(line, "default"), line)
	assert.NotContains(t, line, o.AgentID)
}

func TestIgnoredFlagsAreReported(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	fs := o.Flags()
	require.NoError(t, fs.Parse([]string{"--kubeconfig=/k", "--warn-on-channel-limit", "--xfr-channel-size=10"}))
	assert.Equal(t, []string{"--warn-on-channel-limit", "--xfr-channel-size"}, serve.IgnoredFlags(fs))
}

// Config turns the flags into the agent's configuration, with the target
// policy the flags mean. It is data: whatever the flags ask for (DNS,
// leases at an API server that is not there), it starts nothing and
// reaches nothing, so that a failure after it leaves nothing to stop.
//
// It runs alone (not in parallel), so that any goroutine it finds is
// Config's.
func TestConfig(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, kubeclient.WriteKubeconfig(kubeconfig, "https://127.0.0.1:1", "t"))
	tests := []struct {
		name       string
		args       []string
		wantPolicy agent.TargetPolicy
		wantMode   agent.DialMode
		// wantMax is the cap on every count; 0 means the default.
		wantMax int
	}{
		{name: "upstream default", args: nil, wantPolicy: agent.TargetReceived, wantMode: agent.DialLoadBalancer},
		{name: "max without dns", args: []string{"--server-count-source=max"}, wantPolicy: agent.TargetMax, wantMode: agent.DialLoadBalancer},
		{name: "dns", args: []string{"--server-count-dns=proxy.example.", "--server-count-dns-server=127.0.0.1:1"}, wantPolicy: agent.TargetCounted, wantMode: agent.DialLoadBalancer},
		{name: "dns resolved max", args: []string{"--server-count-dns=proxy.example.", "--server-count-dns-server=127.0.0.1:1", "--server-dial-mode=resolved", "--server-count-source=max"},
			wantPolicy: agent.TargetMax, wantMode: agent.DialResolved},
		{name: "leases", args: []string{"--count-server-leases", "--kubeconfig=" + kubeconfig},
			wantPolicy: agent.TargetCounted, wantMode: agent.DialLoadBalancer},
		{name: "dns and leases", args: []string{"--count-server-leases", "--kubeconfig=" + kubeconfig, "--server-count-dns=proxy.example.", "--server-count-dns-server=127.0.0.1:1"},
			wantPolicy: agent.TargetCounted, wantMode: agent.DialLoadBalancer},
		{name: "max caps received counts", args: []string{"--server-count-source=max", "--server-count-max=7"}, wantPolicy: agent.TargetMax, wantMode: agent.DialLoadBalancer, wantMax: 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := options.NewOptions()
			require.NoError(t, o.Flags().Parse(append([]string{"--insecure-plaintext", "--agent-identifiers=host=node-1"}, tc.args...)))
			require.Empty(t, o.Validate())
			before := goleak.IgnoreCurrent()
			cfg := o.Config()
			goleak.VerifyNone(t, before)
			a := cfg.Agent
			assert.Equal(t, tc.wantPolicy, a.TargetPolicy)
			assert.Equal(t, tc.wantMode, a.DialMode)
			assert.Equal(t, "127.0.0.1:8091", a.ServerAddress)
			assert.Equal(t, "host=node-1", a.Identifiers.String())
			assert.True(t, a.Insecure)
			assert.Nil(t, cfg.TLS, "no TLS files with --insecure-plaintext")
			wantMax := tc.wantMax
			if wantMax == 0 {
				wantMax = agent.DefaultServerCountMax
			}
			assert.Equal(t, wantMax, a.ServerCountMax, "--server-count-max caps every source")
			assert.Equal(t, agent.DefaultMaxConcurrentDials, a.MaxConcurrentDials)
			assert.Equal(t, agent.DefaultMaxTunnelsPerServer, a.MaxTunnelsPerServer)
			assert.Equal(t, servercounter.StaticServerCounter(1), a.Counter, "app.New builds the count, not Config")
			assert.Same(t, o.Count, cfg.Count)
			assert.Equal(t, wire.DefaultHeartbeat, a.Heartbeat)
			assert.False(t, a.ReadyWhenAll, "readiness is upstream's by default")
		})
	}
}

// The liveness flags: 0 turns heartbeats off, which the package spells
// -1, and the readiness flags reach the agent as given.
func TestLivenessConfig(t *testing.T) {
	o := options.NewOptions()
	require.NoError(t, o.Flags().Parse([]string{"--insecure-plaintext", "--heartbeat-interval=0", "--readiness-all-servers", "--readiness-grace-period=10s"}))
	require.Empty(t, o.Validate())
	a := o.Config().Agent
	assert.Equal(t, time.Duration(-1), a.Heartbeat)
	assert.True(t, a.ReadyWhenAll)
	assert.Equal(t, 10*time.Second, a.ReadinessGracePeriod)
	assert.Equal(t, options.DefaultKeepaliveTime, o.KeepaliveTime)
	assert.Equal(t, options.DefaultKeepaliveTimeout, o.KeepaliveTimeout)
}

// --server-count-hold-down=0 means no hold-down, which the
// package spells -1; before, 0 became the 30 s default without a word.
func TestZeroHoldDownMeansNone(t *testing.T) {
	o := options.NewOptions()
	require.NoError(t, o.Flags().Parse([]string{"--insecure-plaintext", "--server-count-hold-down=0"}))
	require.Empty(t, o.Validate())
	assert.Equal(t, time.Duration(-1), o.Config().Agent.HoldDown)
}
