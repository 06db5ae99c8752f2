package counting_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/metricstest"
)

func parseLeases(t *testing.T, args ...string) *counting.LeaseOptions {
	t.Helper()
	o := counting.NewLeaseOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return o
}

func TestCountFlags(t *testing.T) {
	o := parseLeases(t)
	assert.False(t, o.Enabled)
	assert.Equal(t, "kube-system", o.Namespace)
	assert.Equal(t, "k8s-app=konnectivity-server", o.LabelSelector)
	assert.Equal(t, "app=a", parseLeases(t, "--lease-label=app=a").LabelSelector, "the deprecated spelling")
	assert.Equal(t, "app=b", parseLeases(t, "--lease-label-selector=app=b").LabelSelector)
	assert.Empty(t, parseLeases(t, "--lease-label-selector=!!").Validate(), "checked only when enabled")
	errs := parseLeases(t, "--count-server-leases", "--lease-label-selector=a b", "--lease-namespace=").Validate()
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[0], "--lease-namespace")
	assert.ErrorContains(t, errs[1], `invalid --lease-label-selector "a b"`)
}

// With the API server unreachable the count is unknown, never zero, and
// the failed lists are counted under upstream's name.
func TestUnreachableAPIServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now
	reg := prometheus.NewRegistry()
	c, err := parseLeases(t, "--count-server-leases").Build(&rest.Config{Host: "http://" + addr, Timeout: time.Second}, reg)
	require.NoError(t, err)
	defer c.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Count(ctx)
	require.Error(t, err, "unknown while nothing was ever listed")
	require.Eventually(t, func() bool {
		v, ok := metricstest.Value(reg, "konnectivity_network_proxy_agent_lease_lists_total", "http_response_code", "0")
		return ok && v >= 1
	}, 10*time.Second, 10*time.Millisecond, "failed lists counted")
	_, ok := metricstest.Value(reg, "konnectivity_network_proxy_agent_lease_watches_total")
	assert.False(t, ok, "no watch series before a watch: upstream creates series when they happen")
}

func TestPublishFlags(t *testing.T) {
	parse := func(args ...string) *counting.PublishOptions {
		o := counting.NewPublishOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		return o
	}
	o := parse()
	assert.False(t, o.Enabled)
	assert.Equal(t, "kube-system", o.Namespace)
	assert.Equal(t, "k8s-app=konnectivity-server", o.Labels)
	assert.Empty(t, parse("--enable-lease-controller", "--lease-label=a=b,c=d").Validate())
	errs := parse("--enable-lease-controller", "--lease-label=a", "--lease-namespace=").Validate()
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[0], "--lease-namespace")
	assert.ErrorContains(t, errs[1], `invalid --lease-label "a"`)
}
