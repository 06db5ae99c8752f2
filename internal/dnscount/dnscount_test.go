package dnscount_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/dnscount"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/metricstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const svc = "proxy.kube-system.svc.cluster.local."

func parse(t *testing.T, args ...string) *dnscount.Options {
	t.Helper()
	o := dnscount.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs, true)
	require.NoError(t, fs.Parse(args))
	return o
}

func TestBuildCountsAndExportsMetrics(t *testing.T) {
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	o := parse(t, "--server-count-dns="+svc, "--server-count-dns-server="+srv.Addr(), "--server-count-max=1")
	require.Empty(t, o.Validate())
	reg := prometheus.NewRegistry()
	c, err := o.Build(reg, "agent", 1)
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool {
		return gauge(t, reg, "servercount_agent_dns_server_count") == 1
	}, 10*time.Second, time.Millisecond, "clamped to --server-count-max")
	assert.Equal(t, 1, c.CountServers())
	assert.GreaterOrEqual(t, counter(t, reg, "servercount_agent_dns_lookups_total", "records"), 1.0)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	errs := parse(t, "--server-count-cache-ttl-min=0s", "--fallback-server-count=0", "--server-count-max=0", "--server-count-dns-server=1.2.3.4").Validate()
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, w := range []string{"cache TTLs", "--fallback-server-count 0", "--server-count-max 0", "need --server-count-dns"} {
		assert.Contains(t, joined, w)
	}
	assert.Empty(t, parse(t, "--server-count-dns=x.example").Validate())
}

func TestParseRejectsBadType(t *testing.T) {
	t.Parallel()
	o := dnscount.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs, true)
	err := fs.Parse([]string{"--server-count-dns-type=mx"})
	assert.ErrorContains(t, err, `invalid argument "mx" for "--server-count-dns-type" flag: use auto, srv, a, aaaa or ip`)
}

func TestBuildRejectsBadName(t *testing.T) {
	t.Parallel()
	_, err := parse(t, "--server-count-dns=a..b", "--server-count-dns-server=127.0.0.1:53").Build(nil, "agent", 1)
	assert.ErrorContains(t, err, `--server-count-dns: servercounter: invalid name "a..b"`)
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, ok := metricstest.Value(reg, name)
	if !ok {
		return -1
	}
	return v
}

func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	v, ok := metricstest.Value(reg, name, "outcome", outcome)
	if !ok {
		return -1
	}
	return v
}
