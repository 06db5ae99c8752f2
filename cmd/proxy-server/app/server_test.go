package app_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/proxy-server/app"
	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testOptions are a plaintext HTTP CONNECT server on loopback ports,
// counting servers through DNS (a counter with goroutines of its own) at
// a nameserver that never answers, and publishing its lease to an API
// server that is not there.
func testOptions(t *testing.T, ports []int) *options.Options {
	o := options.NewOptions()
	o.Mode = options.ModeHTTPConnect
	o.InsecurePlaintext = true
	o.ServerID = "test"
	o.AgentPort, o.ServerPort, o.HealthPort, o.AdminPort = ports[0], ports[1], ports[2], ports[3]
	o.HealthBindAddress = "127.0.0.1"
	o.DNS.Name = "proxy-server.example."
	o.DNS.Servers = []string{"127.0.0.1:1"}
	o.Leases.Enabled = true
	o.Kube.Kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, kubeclient.WriteKubeconfig(o.Kube.Kubeconfig, "https://127.0.0.1:1", "t"))
	require.Empty(t, o.Validate())
	return o
}

// New fails at its last step (the admin port is taken) after it has
// listened on three ports, started the DNS counter and made the lease
// publisher: it releases them all, and leaves no goroutine.
func TestNewReleasesWhatItMadeOnError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	free := nettest.FreePorts(t, 3)
	o := testOptions(t, append(free, taken.Addr().(*net.TCPAddr).Port))

	s, err := app.New(o.Config(), prometheus.NewRegistry())
	require.Error(t, err)
	assert.Nil(t, s)
	assert.Contains(t, err.Error(), "admin")
	nettest.RequireReleased(t, free...)
	goleak.VerifyNone(t)
}

// Run serves on what New opened, stops when its context ends, and Close
// then leaves nothing.
func TestRunServesThenReleasesEverything(t *testing.T) {
	ports := nettest.FreePorts(t, 4)
	o := testOptions(t, ports)
	o.GracefulShutdownTimeout = 0
	s, err := app.New(o.Config(), prometheus.NewRegistry())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	health := fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[2])
	proctest.RequireStatus(t, health, http.StatusOK, 10*time.Second, "the health port does not serve")
	cancel()
	proctest.RequireReturns(t, done, 30*time.Second)
	s.Close()
	nettest.RequireReleased(t, ports...)
	goleak.VerifyNone(t)
}

// A server that checks agents against a token file still publishes its
// lease: the two are independent.
func TestTokenFileServerPublishesItsLease(t *testing.T) {
	leaseCalls := make(chan string, 100)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/leases") {
			select {
			case leaseCalls <- r.Method + " " + r.URL.Path:
			default:
			}
		}
		http.Error(w, "this API server has nothing", http.StatusServiceUnavailable)
	}))
	defer api.Close()
	ports := nettest.FreePorts(t, 4)
	o := testOptions(t, ports)
	o.GracefulShutdownTimeout = 0
	o.AgentTokenFile = filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(o.AgentTokenFile, []byte("secret\n"), 0o600))
	require.NoError(t, kubeclient.WriteKubeconfig(o.Kube.Kubeconfig, api.URL, "t"))
	require.Empty(t, o.Validate())
	s, err := app.New(o.Config(), prometheus.NewRegistry())
	require.NoError(t, err)
	defer s.Close()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case call := <-leaseCalls:
		t.Logf("lease call: %s", call)
	case <-time.After(30 * time.Second):
		t.Error("the server with --agent-token-file made no lease call within 30s")
	}
	cancel()
	proctest.RequireReturns(t, done, 30*time.Second)
}
