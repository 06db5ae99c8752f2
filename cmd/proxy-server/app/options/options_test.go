package options_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/pkg/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var tlsFlags = []string{
	"--cluster-cert=/c/s.crt", "--cluster-key=/c/s.key", "--cluster-ca-cert=/c/ca.crt",
	"--server-cert=/c/s.crt", "--server-key=/c/s.key", "--server-ca-cert=/c/ca.crt",
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr []string
		// wantParseErr is the error of a value refused by the flag
		// itself, before Validate.
		wantParseErr string
	}{
		{name: "tls", args: tlsFlags},
		{name: "insecure local", args: []string{"--insecure-plaintext"}},
		{name: "uds frontend needs no server certs", args: []string{"--uds-name=/tmp/k.sock", "--cluster-cert=/c/s.crt", "--cluster-key=/c/s.key"}},
		{name: "http-connect", args: append([]string{"--mode=http-connect"}, tlsFlags...)},
		{name: "no tls", args: nil, wantErr: []string{"agents need TLS: set --cluster-cert and --cluster-key", "the frontend port needs mTLS"}},
		{name: "bad mode", args: append([]string{"--mode=socks"}, tlsFlags...), wantErr: []string{`invalid --mode "socks": use grpc or http-connect`}},
		{name: "zero servers", args: append([]string{"--server-count=0"}, tlsFlags...), wantErr: []string{"invalid --server-count 0: must be at least 1"}},
		{name: "bad strategy", args: append([]string{"--proxy-strategies=destHost,nearest"}, tlsFlags...), wantParseErr: `invalid argument "destHost,nearest" for "--proxy-strategies" flag: unknown proxy strategy "nearest"`},
		{name: "token review", args: append([]string{"--agent-namespace=kube-system", "--agent-service-account=konnectivity-agent", "--authentication-audience=system:konnectivity-server"}, tlsFlags...)},
		{name: "service account alone", args: append([]string{"--agent-service-account=konnectivity-agent"}, tlsFlags...), wantErr: []string{"--agent-namespace and --agent-service-account go together"}},
		{name: "two token checks", args: append([]string{"--agent-namespace=a", "--agent-service-account=b", "--agent-token-file=/t"}, tlsFlags...), wantErr: []string{"--agent-token-file and --agent-service-account exclude each other"}},
		{name: "audience without service account", args: append([]string{"--authentication-audience=x"}, tlsFlags...), wantErr: []string{"--authentication-audience needs --agent-namespace"}},
		{name: "kubeconfig for nothing", args: append([]string{"--kubeconfig=/k"}, tlsFlags...), wantErr: []string{"--kubeconfig needs --agent-namespace and --agent-service-account, or --enable-lease-controller"}},
		{name: "leases", args: append([]string{"--enable-lease-controller", "--kubeconfig=/k", "--lease-namespace=ns", "--lease-label=app=proxy,tier=cp"}, tlsFlags...)},
		{name: "bad lease label", args: append([]string{"--enable-lease-controller", "--lease-label=app"}, tlsFlags...), wantErr: []string{`invalid --lease-label "app"`}},
		{name: "tls policy", args: append([]string{"--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "--tls-min-version=VersionTLS13"}, tlsFlags...)},
		{name: "bad cipher suite", args: append([]string{"--cipher-suites=TLS_NULL"}, tlsFlags...), wantParseErr: `invalid argument "TLS_NULL" for "--cipher-suites" flag: unknown cipher suite "TLS_NULL"`},
		{name: "bad tls version", args: append([]string{"--tls-min-version=1.3"}, tlsFlags...), wantParseErr: `invalid argument "1.3" for "--tls-min-version" flag: unknown TLS version "1.3"`},
		{name: "bad port", args: append([]string{"--agent-port=99999"}, tlsFlags...), wantErr: []string{"invalid --agent-port 99999"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := options.NewOptions()
			err := o.Flags().Parse(tc.args)
			if tc.wantParseErr != "" {
				require.ErrorContains(t, err, tc.wantParseErr)
				return
			}
			require.NoError(t, err)
			errs := o.Validate()
			var msgs []string
			for _, err := range errs {
				msgs = append(msgs, err.Error())
			}
			all := strings.Join(msgs, "\n")
			for _, w := range tc.wantErr {
				assert.Contains(t, all, w)
			}
			assert.Len(t, errs, len(tc.wantErr), all)
		})
	}
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
