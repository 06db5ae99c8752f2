package counting_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/logtest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const svc = "proxy.kube-system.svc.cluster.local."

func parseDNS(t *testing.T, args ...string) *counting.DNSOptions {
	t.Helper()
	o := counting.NewDNSOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs, true)
	require.NoError(t, fs.Parse(args))
	return o
}

func TestBuildCountsAndExportsMetrics(t *testing.T) {
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	o := parseDNS(t, "--server-count-dns="+svc, "--server-count-dns-server="+srv.Addr())
	require.Empty(t, o.Validate())
	reg := prometheus.NewRegistry()
	c, err := o.Build(reg, "agent", 1, 1)
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool {
		return value(reg, "servercount_agent_dns_server_count") == 1
	}, 10*time.Second, time.Millisecond, "clamped to the max Build was given (--server-count-max)")
	assert.Equal(t, 1, c.CountServers())
	assert.GreaterOrEqual(t, value(reg, "servercount_agent_dns_lookups_total", "outcome", "records"), 1.0)
}

// While DNS fails the count backs off, and the metrics say how
// long the wait is and when it ends; a success sets both to 0.
func TestBackoffIsExported(t *testing.T) {
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	o := parseDNS(t, "--server-count-dns="+svc, "--server-count-dns-server="+srv.Addr(), "--server-count-cache-ttl-min=20ms", "--server-count-dns-retry-max=200ms")
	require.Empty(t, o.Validate())
	reg := prometheus.NewRegistry()
	c, err := o.Build(reg, "agent", 1, servercounter.DefaultMax)
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool { return value(reg, "servercount_agent_dns_backoff_seconds") > 0 }, 10*time.Second, time.Millisecond, "no back-off exported")
	wait := value(reg, "servercount_agent_dns_backoff_seconds")
	assert.LessOrEqual(t, wait, 0.2, "a wait beyond --server-count-dns-retry-max")
	at := value(reg, "servercount_agent_dns_retry_timestamp_seconds")
	assert.InDelta(t, float64(time.Now().UnixNano())/1e9, at, 1, "the retry is due within the wait")
	srv.ClearFault()
	require.Eventually(t, func() bool {
		return value(reg, "servercount_agent_dns_backoff_seconds") == 0 && value(reg, "servercount_agent_dns_retry_timestamp_seconds") == 0
	}, 10*time.Second, time.Millisecond, "the back-off not cleared by a success")
	assert.Equal(t, 2, c.CountServers())
}

func TestValidate(t *testing.T) {
	t.Parallel()
	errs := parseDNS(t, "--server-count-cache-ttl-min=0s", "--fallback-server-count=0", "--server-count-dns-server=1.2.3.4", "--server-count-dns-retry-max=0s").Validate()
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, w := range []string{"cache TTLs", "--fallback-server-count 0", "need --server-count-dns", "invalid --server-count-dns-retry-max 0s"} {
		assert.Contains(t, joined, w)
	}
	assert.Empty(t, parseDNS(t, "--server-count-dns=x.example").Validate())
	assert.Empty(t, parseDNS(t, "--server-count-dns=x.example", "--server-count-dns-server=10.0.0.10,[::1]:53,localhost:5353,::1").Validate())
}

// A bad nameserver or name is refused by Validate, naming its own flag,
// without the library's prefix.
func TestValidateNamesTheDNSFlag(t *testing.T) {
	t.Parallel()
	errs := parseDNS(t, "--server-count-dns=a..b", "--server-count-dns-server=bad host,10.0.0.1:99999").Validate()
	require.Len(t, errs, 3)
	assert.EqualError(t, errs[0], `invalid --server-count-dns "a..b": not a DNS name; use one like proxy-server.kube-system.svc.cluster.local`)
	assert.EqualError(t, errs[1], `invalid --server-count-dns-server "bad host": want host:port or host, e.g. 10.96.0.10:53`)
	assert.EqualError(t, errs[2], `invalid --server-count-dns-server "10.0.0.1:99999": want host:port or host, e.g. 10.96.0.10:53`)
}

func TestParseRejectsBadType(t *testing.T) {
	t.Parallel()
	o := counting.NewDNSOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs, true)
	err := fs.Parse([]string{"--server-count-dns-type=mx"})
	assert.ErrorContains(t, err, `invalid argument "mx" for "--server-count-dns-type" flag: use auto, srv, a, aaaa or ip`)
}

func TestBuildRejectsBadName(t *testing.T) {
	t.Parallel()
	_, err := parseDNS(t, "--server-count-dns=a..b", "--server-count-dns-server=127.0.0.1:53").Build(nil, "agent", 1, servercounter.DefaultMax)
	assert.ErrorContains(t, err, `--server-count-dns: servercounter: invalid name "a..b"`)
}

// value is the value of reg's series name with labels, or -1 if it has
// none.
func value(reg prometheus.Gatherer, name string, labels ...string) float64 {
	if v, ok := metricstest.Value(reg, name, labels...); ok {
		return v
	}
	return -1
}

// An agent that cannot reach DNS says so at the default level, once
// however often it retries.
func TestUnreachableDNSLoggedOnceAtLevelZero(t *testing.T) {
	l, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := l.LocalAddr().String()
	require.NoError(t, l.Close()) // queries to it are refused from here on

	out := countFailing(t, refused).String()
	assert.Equal(t, 1, strings.Count(out, "Failed to count proxy-servers through DNS"), out)
	assert.Contains(t, out, refused)
}

// The end of a DNS failure is logged at level 0 too.
func TestDNSRecoveryLoggedAtLevelZero(t *testing.T) {
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	logs := countFailing(t, srv.Addr())
	srv.ClearFault()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "Recovered: count proxy-servers through DNS") }, 10*time.Second, time.Millisecond)
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "Failed to count proxy-servers through DNS"), out)
	assert.Contains(t, out, "count=2")
}

// countFailing starts counting svc through the nameserver at server,
// refreshing every 10 to 20 ms and logging at level 0, until the test
// ends. It waits for 3 failed refreshes and returns the log.
func countFailing(t *testing.T, server string) *logtest.Buffer {
	t.Helper()
	o := parseDNS(t, "--server-count-dns="+svc, "--server-count-dns-server="+server, "--server-count-cache-ttl-min=10ms", "--server-count-cache-ttl-max=20ms", "--server-count-dns-retry-max=40ms")
	require.Empty(t, o.Validate())
	var logs *logtest.Buffer
	o.Logger, logs = logtest.NewLogger(0)
	reg := prometheus.NewRegistry()
	c, err := o.Build(reg, "agent", 1, servercounter.DefaultMax)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.Eventually(t, func() bool { return failures(t, reg) >= 3 }, 10*time.Second, time.Millisecond, "several failed refreshes")
	return logs
}

// failures sums the failed DNS refreshes of every kind.
func failures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	var n float64
	for _, kind := range []string{"timeout", "servfail", "refused", "malformed", "network"} {
		if v := value(reg, "servercount_agent_dns_lookups_total", "outcome", kind); v > 0 {
			n += v
		}
	}
	return n
}
