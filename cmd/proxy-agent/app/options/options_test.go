package options_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
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

func TestAcceptsEveryUpstreamFlag(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	fs := o.Flags()
	require.NoError(t, fs.Parse(upstreamFlags))
	assert.Empty(t, o.Validate())
	assert.Equal(t, "konnectivity.example", o.ProxyServerHost)
	assert.Empty(t, o.ALPN(), `"[]" is pflag's printing of an empty slice`)
	require.NoError(t, fs.Parse([]string{"--alpn-proto=h2,konnectivity"}))
	assert.Equal(t, []string{"h2", "konnectivity"}, o.ALPN())
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{name: "defaults", args: nil},
		{name: "insecure", args: []string{"--insecure-plaintext"}},
		{name: "leases not supported", args: []string{"--count-server-leases"}, wantErr: []string{"--count-server-leases is not supported"}},
		{name: "cert without key", args: []string{"--agent-cert=/c/a.crt"}, wantErr: []string{"--agent-cert and --agent-key go together"}},
		{name: "cap below interval", args: []string{"--sync-interval=5s", "--sync-interval-cap=1s"}, wantErr: []string{"--sync-interval-cap 1s must be at least --sync-interval 5s"}},
		{name: "bad source", args: []string{"--server-count-source=leases"}, wantErr: []string{`invalid --server-count-source "leases": use default or max`}},
		{name: "bad identifiers", args: []string{"--agent-identifiers=default-route=maybe"}, wantErr: []string{"invalid --agent-identifiers"}},
		{name: "bad port", args: []string{"--health-server-port=70000"}, wantErr: []string{"invalid --health-server-port 70000"}},
		{name: "dns counting", args: []string{"--server-count-dns=proxy.kube-system.svc.cluster.local", "--server-dial-mode=resolved", "--server-count-source=max"}},
		{name: "resolved needs dns", args: []string{"--server-dial-mode=resolved"}, wantErr: []string{"--server-dial-mode=resolved needs --server-count-dns"}},
		{name: "bad dial mode", args: []string{"--server-dial-mode=nearest"}, wantErr: []string{"invalid --server-dial-mode"}},
		{name: "bad dns type", args: []string{"--server-count-dns=x.example", "--server-count-dns-type=mx"}, wantErr: []string{"invalid --server-count-dns-type"}},
		{name: "negative hold-down", args: []string{"--server-count-hold-down=-1s"}, wantErr: []string{"invalid --server-count-hold-down"}},
		{name: "every problem at once", args: []string{"--agent-id=", "--proxy-server-host=", "--probe-interval=0s"},
			wantErr: []string{"--agent-id must not be empty", "--proxy-server-host must not be empty", "must be positive"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := options.NewOptions()
			require.NoError(t, o.Flags().Parse(tc.args))
			errs := o.Validate()
			var msgs []string
			for _, err := range errs {
				msgs = append(msgs, err.Error())
			}
			all := strings.Join(msgs, "\n")
			if len(tc.wantErr) == 0 {
				assert.Empty(t, errs)
			}
			for _, w := range tc.wantErr {
				assert.Contains(t, all, w)
			}
			assert.Len(t, errs, len(tc.wantErr))
		})
	}
}

func TestIgnoredFlagsAreReported(t *testing.T) {
	t.Parallel()
	o := options.NewOptions()
	fs := o.Flags()
	require.NoError(t, fs.Parse([]string{"--kubeconfig=/k", "--xfr-channel-size=10"}))
	assert.Equal(t, []string{"--kubeconfig", "--xfr-channel-size"}, o.Ignored(fs))
}
