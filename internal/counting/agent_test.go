package counting_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/kubeclient"
)

// unreachableKubeconfig reaches an API server that refuses connections:
// enough to build a lease counter, which never lists.
func unreachableKubeconfig(t *testing.T) kubeclient.Options {
	f := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, kubeclient.WriteKubeconfig(f, "https://127.0.0.1:1", "t"))
	return kubeclient.Options{Kubeconfig: f}
}

// The agent's sources for each combination of flags: none is upstream's
// way (the servers' counts), one source is that source, two are the
// larger of both. Closing the counter stops every source.
func TestAgentOptionsBuild(t *testing.T) {
	dns := dnstest.NewServer(t)
	dns.MustSetZone(t, "proxy-server.example. 30 IN A 10.0.0.1\nproxy-server.example. 30 IN A 10.0.0.2\n")
	for _, tc := range []struct {
		name    string
		args    []string
		counter bool
		dns     bool
	}{
		{"no source", nil, false, false},
		{"no source, max", []string{"--server-count-source=max"}, false, false},
		{"DNS", []string{"--server-count-dns=proxy-server.example.", "--server-count-dns-server=" + dns.Addr()}, true, false},
		{"leases", []string{"--count-server-leases"}, true, false},
		{"DNS and leases", []string{"--server-count-dns=proxy-server.example.", "--server-count-dns-server=" + dns.Addr(), "--count-server-leases"}, true, true},
		{"DNS, max", []string{"--server-count-dns=proxy-server.example.", "--server-count-dns-server=" + dns.Addr(), "--server-count-source=max"}, true, false},
	} {
		tc.dns = slices.ContainsFunc(tc.args, func(a string) bool { return strings.HasPrefix(a, "--server-count-dns=") })
		t.Run(tc.name, func(t *testing.T) {
			o := counting.NewAgentOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			require.NoError(t, fs.Parse(tc.args))
			require.Empty(t, o.Validate())
			c, err := o.Build(unreachableKubeconfig(t), prometheus.NewRegistry())
			require.NoError(t, err)
			assert.Equal(t, tc.counter, o.Counts())
			if !tc.counter {
				assert.Nil(t, c)
				return
			}
			require.NotNil(t, c)
			if tc.dns {
				// The DNS count comes through, the unreachable API
				// server's leases left out.
				require.Eventually(t, func() bool {
					res, err := c.Count(t.Context())
					return err == nil && res.Count == 2
				}, 10*time.Second, 10*time.Millisecond)
			}
			require.NoError(t, c.Close())
		})
	}
}

// An invalid --server-count-source names the flag.
func TestAgentOptionsRejectsABadSource(t *testing.T) {
	o := counting.NewAgentOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	err := fs.Parse([]string{"--server-count-source=min"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "server-count-source")
}
