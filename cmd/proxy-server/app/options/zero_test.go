package options_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/flagtest"
	"github.com/servercount/servercount/pkg/server"
)

// Every count and duration flag of the proxy-server, set to 0: refused
// with a clear error, or given the meaning its usage says, which the
// configuration holds: the server core's as server.New runs with it, its
// defaults applied (the library's "none" is a negative value, its 0 its
// default), the binary's own as Config gives it.
func TestZeroValues(t *testing.T) {
	type zero = flagtest.Zero[*options.Options]
	cfg := func(o *options.Options) options.Config { return o.Config() }
	running := func(t *testing.T, o *options.Options) server.Config {
		s, err := server.New(cfg(o).Server)
		require.NoError(t, err)
		defer s.Close()
		return s.Config()
	}
	none := func(get func(server.Config) time.Duration) func(*testing.T, *options.Options) {
		return func(t *testing.T, o *options.Options) {
			assert.Equal(t, time.Duration(-1), get(running(t, o)), "the library's none")
		}
	}
	anyPort := func(get func(options.Config) int) func(*testing.T, *options.Options) {
		return func(t *testing.T, o *options.Options) { assert.Zero(t, get(cfg(o)), "port 0: any free one") }
	}
	ignored := zero{Means: "ignored"}
	base := append([]string{"--server-count-dns=proxy.example.", "--agent-namespace=ns", "--agent-service-account=sa",
		"--enable-lease-controller", "--kubeconfig=" + tlsFile("s.key")}, tlsFlags...)
	flagtest.ZeroValues(t, options.NewOptions, base, map[string]zero{
		"admin-port":                 {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Admin.Port })},
		"agent-port":                 {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Agents.Port })},
		"health-port":                {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Health.Port })},
		"server-port":                {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Frontends.Port })},
		"backend-dial-timeout":       {Means: "0: wait without limit", Check: none(func(c server.Config) time.Duration { return c.BackendDialTimeout })},
		"unanswered-dial-timeout":    {Means: "0: never", Check: none(func(c server.Config) time.Duration { return c.UnansweredDialTimeout })},
		"heartbeat-interval":         {Means: "0 sends and expects none", Check: none(func(c server.Config) time.Duration { return c.Heartbeat })},
		"stream-stall-timeout":       {Means: "0 never does", Check: none(func(c server.Config) time.Duration { return c.StreamStallTimeout })},
		"frontend-keepalive-time":    {Refused: "invalid --frontend-keepalive-time 0s: must be positive"},
		"frontend-write-timeout":     {Refused: "invalid --frontend-write-timeout 0s: must be positive"},
		"keepalive-time":             {Refused: "invalid --keepalive-time 0s: must be positive"},
		"keepalive-timeout":          {Refused: "invalid --keepalive-timeout 0s: must be positive"},
		"tunnel-window":              {Refused: "invalid --tunnel-window 0: want 1 to 1073741824 bytes, or -1 for no flow control"},
		"server-count":               {Refused: "invalid --server-count 0: must be at least 1"},
		"server-count-max":           {Refused: "invalid --server-count-max 0: must be at least 1"},
		"server-count-cache-ttl-min": {Refused: "want 0 < min <= max"},
		"server-count-cache-ttl-max": {Refused: "want 0 < min <= max"},
		"server-count-dns-retry-max": {Refused: "invalid --server-count-dns-retry-max 0s: must be positive"},
		"server-count-cache-ttl": {Means: "0: the answer's TTL", Check: func(t *testing.T, o *options.Options) {
			assert.Zero(t, cfg(o).DNS.CacheTTL, "0: the answer's TTL")
		}},
		"token-review-qps":   {Refused: "invalid --token-review-qps 0"},
		"token-review-burst": {Refused: "--token-review-burst 0: the rate must be positive and the burst at least 1"},
		"max-agent-handshakes-per-address": {Means: "0: no bound per address", Check: func(t *testing.T, o *options.Options) {
			assert.Equal(t, -1, running(t, o).MaxHandshakesPerAddress, "the library's none")
		}},
		"graceful-shutdown-timeout": {Means: "0: cut at once", Check: func(t *testing.T, o *options.Options) {
			assert.Zero(t, cfg(o).GracefulShutdownTimeout)
		}},
		"shutdown-delay-duration": {Means: "0: stop listening at once", Check: func(t *testing.T, o *options.Options) {
			assert.Zero(t, cfg(o).ShutdownDelay)
		}},
		"kubeconfig-qps": {Means: "0: client-go's default", Check: func(t *testing.T, o *options.Options) {
			assert.Zero(t, cfg(o).Kube.QPS)
		}},
		"kubeconfig-burst": {Means: "0: client-go's default", Check: func(t *testing.T, o *options.Options) {
			assert.Zero(t, cfg(o).Kube.Burst)
		}},
		"xfr-channel-size":            ignored,
		"frontend-write-channel-size": ignored,
	})
}
