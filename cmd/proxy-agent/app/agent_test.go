package app_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-agent/app"
	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testConfig is a plaintext agent with loopback health and admin ports,
// counting servers through DNS (a counter with goroutines of its own) at
// a nameserver that never answers, and a proxy-server that refuses.
func testConfig(t *testing.T, health, admin int) options.Config {
	o := options.NewOptions()
	o.InsecurePlaintext = true
	o.AgentID = "test"
	o.ProxyServerHost, o.ProxyServerPort = "127.0.0.1", 1
	o.HealthServerHost, o.HealthServerPort = "127.0.0.1", health
	o.AdminBindAddress, o.AdminServerPort = "127.0.0.1", admin
	o.Count.DNS.Name = "proxy-server.example."
	o.Count.DNS.Servers = []string{"127.0.0.1:1"}
	require.Empty(t, o.Validate())
	return o.Config()
}

// New fails at its last step (the admin port is taken) after it has
// listened on the health port and started the DNS counter: it releases
// both and leaves no goroutine.
func TestNewReleasesWhatItMadeOnError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	health := nettest.FreePorts(t, 1)[0]

	a, err := app.New(testConfig(t, health, taken.Addr().(*net.TCPAddr).Port), prometheus.NewRegistry())
	require.Error(t, err)
	assert.Nil(t, a)
	assert.Contains(t, err.Error(), "admin")
	nettest.RequireReleased(t, health)
	goleak.VerifyNone(t)
}

// Run serves on what New opened and stops when its context ends, also
// while it drains; Close then leaves nothing.
func TestRunServesThenReleasesEverything(t *testing.T) {
	ports := nettest.FreePorts(t, 2)
	a, err := app.New(testConfig(t, ports[0], ports[1]), prometheus.NewRegistry())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	drain, startDrain := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, drain) }()
	health := fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[0])
	proctest.RequireStatus(t, health, http.StatusOK, 10*time.Second, "the health port does not serve")
	startDrain()
	cancel()
	proctest.RequireReturns(t, done, 30*time.Second)
	a.Close()
	nettest.RequireReleased(t, ports...)
	goleak.VerifyNone(t)
}
