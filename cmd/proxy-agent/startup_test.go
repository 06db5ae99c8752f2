package main

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
)

// Nothing the agent depends on can keep it from serving
// its health port or from stopping. Against an API server that accepts
// TCP and never answers (with --count-server-leases), a nameserver that
// never answers (with --server-count-dns), and a proxy-server that
// accepts TCP and never completes TLS, /healthz answers 200 soon after
// start (before the fix: never, and 10 s) and one SIGTERM stops the agent
// within 5 s (before the fix it ignored two). The bounds are far above
// what the agent takes (milliseconds) and far below the waits it used to
// make; they are the issue's.
func TestAgentStartsAndStopsWhateverItsDependenciesDo(t *testing.T) {
	// The API server and the proxy-server that never answer: a sink takes
	// connections and never writes a byte.
	silentTCP := churn.StartTargets(t).Sink
	silentUDP := silentUDPSocket(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, kubeclient.WriteKubeconfig(kubeconfig, "https://"+silentTCP, "agent"))
	ca, err := pkitest.NewCA("startup-ca")
	require.NoError(t, err)
	certs, err := ca.WriteFiles(dir)
	require.NoError(t, err)
	_, silentPort, _ := net.SplitHostPort(silentTCP)
	refused := nettest.FreePorts(t, 1)[0]

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"API server that never answers", []string{"--insecure-plaintext", "--proxy-server-host=127.0.0.1", port("proxy-server-port", refused),
			"--count-server-leases", "--kubeconfig=" + kubeconfig}},
		{"nameserver that never answers", []string{"--insecure-plaintext", "--proxy-server-host=127.0.0.1", port("proxy-server-port", refused),
			"--server-count-dns=proxy-server.example.test", "--server-count-dns-server=" + silentUDP}},
		{"proxy-server that never completes TLS", append([]string{"--proxy-server-host=127.0.0.1", "--proxy-server-port=" + silentPort},
			agentTLS(certs)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ports := nettest.FreePorts(t, 2)
			bin := proctest.Build(t, "cmd/proxy-agent")
			started := time.Now()
			a := proctest.Start(t, bin, append(tc.args, "--health-server-host=127.0.0.1",
				port("health-server-port", ports[0]), port("admin-server-port", ports[1]))...)
			healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[0])
			require.Eventually(t, func() bool { return proctest.Status(healthz) == http.StatusOK }, 5*time.Second, 10*time.Millisecond,
				"no /healthz within 5 s:\n%s", a.Output())
			t.Logf("/healthz answered %v after start", time.Since(started).Round(time.Millisecond))

			require.NoError(t, a.Process.Signal(syscall.SIGTERM))
			select {
			case <-a.Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("the agent did not stop within 5 s of SIGTERM:\n%s", a.Output())
			}
		})
	}
}

// silentUDPSocket is a UDP socket that reads nothing and answers nothing:
// a nameserver that never answers.
func silentUDPSocket(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c.LocalAddr().String()
}
