package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/proctest"
)

// The sidecar layout (Kubermatic #16303, HyperShift OCPBUGS-23457): the
// proxy-server runs in kube-apiserver's pod, whose readiness gates on
// what needs the tunnel, so a new pod is Ready only once an agent has
// connected to its server. Behind a Service that publishes only ready
// pods, agents never learn of the new server, it never becomes Ready, and
// the rollout stops. Here the headless Service publishes not-ready
// addresses, agents count it through DNS and dial each address
// (--server-dial-mode=resolved), and the pod's readiness is its server's
// /readyz (200 once an agent is connected). A rollout with maxSurge 1 and
// maxUnavailable 0, as a Deployment does it, replaces every server: each
// new server becomes ready with nobody stepping in. The same rollout
// without publishNotReadyAddresses is shown to stall.
func TestSidecarRollout(t *testing.T) {
	e := newEnv(t, true)
	// What the EndpointSlice controller writes with publishNotReadyAddresses:
	// every pod's endpoint ready, whatever its readiness.
	pods := e.startReady(3)
	agents := e.startAgents(3, "resolved", nil)
	waitConnections(t, agents, 3, 30*time.Second)

	var report strings.Builder
	live := append([]string(nil), pods...)
	start := time.Now()
	for i := range 3 {
		pod := e.startServers(3+i, 4+i)[0]
		live = append(live, pod)
		e.setReady(live...)
		surged := time.Now()
		e.waitPodReady(pod, 60*time.Second)
		fmt.Fprintf(&report, "server %d (%s): ready %.2fs after it started\n", i+1, pod, time.Since(surged).Seconds())
		old := live[0]
		live = live[1:]
		e.setReady(live...)
		e.stopServer(old)
	}
	total := time.Since(start)
	fmt.Fprintf(&report, "rollout of 3 servers, maxSurge 1, maxUnavailable 0: %.2fs\n", total.Seconds())
	t.Logf("sidecar rollout:\n%s", report.String())
	require.NoError(t, harness.WriteFile(t.ArtifactDir(), "sidecar-rollout.txt", report.String()))
	waitConnections(t, agents, 3, 30*time.Second)
	e.requestThroughEach(live...)

	// Without publishNotReadyAddresses the controller writes the new pod's
	// endpoint not ready: DNS leaves it out, no agent dials it, and it
	// never becomes ready; a Deployment waits for it for ever.
	pod := e.startServers(6, 7)[0]
	eps := append(harness.Ready(live...), harness.Endpoint{IP: pod})
	require.NoError(t, e.svc.SetEndpoints(t.Context(), eps...))
	assert.Never(t, func() bool { return e.podReady(pod) }, 5*time.Second, 100*time.Millisecond,
		"a server whose endpoint is not published became ready")
}

// podReady reports whether the server on ip answers /readyz with 200: an
// agent is connected to it.
func (e *env) podReady(ip string) bool {
	return proctest.Status(fmt.Sprintf("http://%s/readyz", net.JoinHostPort(ip, strconv.Itoa(e.fleet.HealthPort)))) == http.StatusOK
}

// waitPodReady waits until the server on ip is ready.
func (e *env) waitPodReady(ip string, within time.Duration) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.podReady(ip) }, within, 50*time.Millisecond, "server %s never became ready", ip)
}
