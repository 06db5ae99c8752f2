package options_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/flagtest"
	"github.com/servercount/servercount/pkg/agent"
)

// Every count and duration flag of the proxy-agent, set to 0: refused
// with a clear error, or given the meaning its usage says, which the
// configuration holds: the agent core's as agent.NewClientSet runs with
// it, its defaults applied (the library's "none" is a negative value, its
// 0 its default), the binary's own as Config gives it.
func TestZeroValues(t *testing.T) {
	type zero = flagtest.Zero[*options.Options]
	ca, cert, key := tlsFiles(t)
	cfg := func(o *options.Options) options.Config { return o.Config() }
	running := func(t *testing.T, o *options.Options) agent.Config {
		c := cfg(o).Agent
		c.Insecure = true // the credentials are app.New's; the fields here are not
		cs, err := agent.NewClientSet(c)
		require.NoError(t, err)
		return cs.Config()
	}
	runs := func(want time.Duration, get func(agent.Config) time.Duration) func(*testing.T, *options.Options) {
		return func(t *testing.T, o *options.Options) { assert.Equal(t, want, get(running(t, o))) }
	}
	is := func(want time.Duration, get func(options.Config) time.Duration) func(*testing.T, *options.Options) {
		return func(t *testing.T, o *options.Options) { assert.Equal(t, want, get(cfg(o))) }
	}
	anyPort := func(get func(options.Config) int) func(*testing.T, *options.Options) {
		return func(t *testing.T, o *options.Options) { assert.Zero(t, get(cfg(o)), "port 0: any free one") }
	}
	base := []string{"--ca-cert=" + ca, "--agent-cert=" + cert, "--agent-key=" + key,
		"--server-count-dns=proxy.example.", "--count-server-leases", "--readiness-all-servers"}
	flagtest.ZeroValues(t, options.NewOptions, base, map[string]zero{
		"admin-server-port":          {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Admin.Port })},
		"health-server-port":         {Means: "0: any free port", Check: anyPort(func(c options.Config) int { return c.Health.Port })},
		"proxy-server-port":          {Refused: "--proxy-server-port must be set"},
		"heartbeat-interval":         {Means: "0 sends and expects none", Check: runs(-1, func(c agent.Config) time.Duration { return c.Heartbeat })},
		"stream-stall-timeout":       {Means: "0 never does", Check: runs(-1, func(c agent.Config) time.Duration { return c.StreamStallTimeout })},
		"server-count-hold-down":     {Means: "0: none", Check: runs(-1, func(c agent.Config) time.Duration { return c.HoldDown })},
		"readiness-grace-period":     {Means: "0: at once", Check: runs(0, func(c agent.Config) time.Duration { return c.ReadinessGracePeriod })},
		"drain-timeout":              {Means: "0: no bound", Check: is(0, func(c options.Config) time.Duration { return c.DrainTimeout })},
		"server-count-cache-ttl":     {Means: "0: the answer's TTL", Check: is(0, func(c options.Config) time.Duration { return c.Count.DNS.CacheTTL })},
		"endpoint-write-timeout":     {Refused: "invalid --endpoint-write-timeout 0s: must be positive"},
		"keepalive-time":             {Refused: "invalid --keepalive-time 0s: must be positive"},
		"keepalive-timeout":          {Refused: "invalid --keepalive-timeout 0s: must be positive"},
		"sync-interval":              {Refused: "--sync-interval and --probe-interval must be positive"},
		"probe-interval":             {Refused: "--sync-interval and --probe-interval must be positive"},
		"sync-interval-cap":          {Refused: "--sync-interval-cap 0s must be at least --sync-interval"},
		"max-concurrent-dials":       {Refused: "invalid --max-concurrent-dials 0: must be at least 1"},
		"max-tunnels-per-server":     {Refused: "invalid --max-tunnels-per-server 0: must be at least 1"},
		"tunnel-window":              {Refused: "invalid --tunnel-window 0: want 1 to 1073741824 bytes, or -1 for no flow control"},
		"fallback-server-count":      {Refused: "invalid --fallback-server-count 0: must be at least 1"},
		"server-count-max":           {Refused: "invalid --server-count-max 0: must be at least 1"},
		"server-count-cache-ttl-min": {Refused: "want 0 < min <= max"},
		"server-count-cache-ttl-max": {Refused: "want 0 < min <= max"},
		"server-count-dns-retry-max": {Refused: "invalid --server-count-dns-retry-max 0s: must be positive"},
		"xfr-channel-size":           {Means: "ignored"},
	})
}
