package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/balancer"
	"github.com/servercount/servercount/pkg/lease"
)

// leaseFlags are a server's or an agent's flags for leases in the test's
// namespace, through the suite's API server.
func (e *env) leaseFlags(role string) []string {
	flags := []string{"--lease-namespace=" + e.ns, "--kubeconfig=" + the.cluster.Kubeconfig}
	if role == "server" {
		return append(flags, "--enable-lease-controller")
	}
	return append(flags, "--count-server-leases")
}

// startLeaseAgents starts n agents that count leases and dial the servers
// through lb.
func (e *env) startLeaseAgents(n int, lb *balancer.Balancer) []*harness.Agent {
	e.t.Helper()
	var agents []*harness.Agent
	for i := range n {
		agents = append(agents, e.fleet.StartAgent(e.t, harness.AgentConfig{
			Name: fmt.Sprintf("agent-%s-%d", e.ns, i), ServerAddr: lb.Addr(), Extra: e.leaseFlags("agent"),
		}))
	}
	return agents
}

// waitLeaseTarget waits until every agent holds want connections and
// targets want from leases, and returns how long that took.
func waitLeaseTarget(t *testing.T, agents []*harness.Agent, want int, within time.Duration) time.Duration {
	t.Helper()
	return waitAgents(t, agents, "leases", want, want, within)
}

// Leases, with the binaries: servers publish them, agents count them and
// follow 3 -> 5 -> 2, where one of the servers that go away is killed
// without a graceful stop: its lease expires, the agents' target drops
// after it expires, and the other servers collect it.
func TestLeaseScaling(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startServers(0, 3, e.leaseFlags("server")...)
	lb := e.newLB(ips...)
	agents := e.startLeaseAgents(2, lb)
	d := waitLeaseTarget(t, agents, 3, 30*time.Second)
	t.Logf("3 servers: every agent holds 3, %.2fs after the last agent's start", d.Seconds())
	e.requestThroughEach(ips...)

	// Up to 5: counted from the new servers' first leases.
	grown := e.startServers(3, 5, e.leaseFlags("server")...)
	began := time.Now()
	lb.SetBackends(e.agentAddrs(append(ips, grown...)...)...)
	waitLeaseTarget(t, agents, 5, 30*time.Second)
	t.Logf("3 -> 5: every agent holds 5, %.2fs after the new servers published their leases", time.Since(began).Seconds())

	// Down to 2: two servers stop gracefully (their leases go with them),
	// one is killed (its lease stays until it expires).
	all := append(ips, grown...)
	keep, gone, killed := all[:2], all[2:4], all[4]
	lb.SetBackends(e.agentAddrs(keep...)...)
	leases := the.cluster.Client.CoordinationV1().Leases(e.ns)
	l, err := leases.Get(t.Context(), lease.NamePrefix+"proxy-server-"+killed, metav1.GetOptions{})
	require.NoError(t, err)
	e.servers[killed].Proc.Kill()
	delete(e.servers, killed)
	for _, ip := range gone {
		e.stopServer(ip)
	}
	require.Eventually(t, func() bool {
		_, err := leases.Get(t.Context(), lease.NamePrefix+"proxy-server-"+gone[0], metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 10*time.Second, 50*time.Millisecond, "a graceful stop deletes the server's lease")
	// The killed server's lease still counts until it expires; nobody
	// answers there.
	waitAgents(t, agents, "leases", 2, 3, 20*time.Second)

	expiry := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	waitLeaseTarget(t, agents, 2, time.Until(expiry)+30*time.Second)
	t.Logf("killed server: every agent targets 2 %.2fs after its lease expired (hold-down 2s)", time.Since(expiry).Seconds())
	require.Eventually(t, func() bool {
		_, err := leases.Get(t.Context(), l.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*lease.DefaultGCInterval+5*time.Second, 200*time.Millisecond, "the killed server's expired lease is collected")
	e.requestThroughEach(keep...)

	// A lease without leaseDurationSeconds is not counted and crashes
	// nothing.
	now := metav1.NewMicroTime(time.Now())
	_, err = leases.Create(t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lease.NamePrefix + "noduration", Labels: map[string]string{"k8s-app": "konnectivity-server"}},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &now, AcquireTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Never(t, func() bool {
		for _, a := range agents {
			if exited, _ := a.Proc.Exited(); exited || a.Target("leases") != 2 {
				return true
			}
		}
		return false
	}, 3*time.Second, 100*time.Millisecond, "agents keep 2 and run")
}

// An agent counting both DNS and leases aims for the larger count: the
// migration from one to the other loses no server.
func TestLeasesAndDNSTakeTheMax(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startServers(0, 3, e.leaseFlags("server")...)
	e.publishReady(ips[:2]...) // DNS knows 2 of the 3
	lb := e.newLB(ips...)
	a := e.fleet.StartAgent(t, harness.AgentConfig{
		Name: "agent-" + e.ns, ServerAddr: lb.Addr(), DNSName: e.svc.SRVName("agent"), DNSServer: the.cluster.DNS.Addr,
		Extra: e.leaseFlags("agent"),
	})
	waitLeaseTarget(t, []*harness.Agent{a}, 3, 30*time.Second)
	e.publishReady(ips...)
	assert.Never(t, func() bool { return a.Connections() != 3 }, 2*time.Second, 100*time.Millisecond, "both sources agree on 3")
}

// A proxy-server started with an upstream manifest's flags, every flag
// upstream's server has among them, starts and serves.
func TestUpstreamServerManifestFlags(t *testing.T) {
	e := newEnv(t, false)
	logFile := filepath.Join(t.TempDir(), "proxy-server.log")
	ip := e.ip(0)
	e.servers[ip] = e.fleet.StartServer(t, ip,
		"--log-file="+logFile, "--logtostderr=false", "--alsologtostderr", "--skip-headers=false",
		"--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
		"--tls-min-version=VersionTLS12", "--kubeconfig-qps=40", "--kubeconfig-burst=100",
		"--kube-api-content-type=application/vnd.kubernetes.protobuf", "--xfr-channel-size=10",
		"--keepalive-time=1h", "--frontend-keepalive-time=1h", "--proxy-strategies=destHost,default",
		"--enable-profiling", "--enable-contention-profiling", "--delete-existing-uds-file",
		"--enable-lease-controller", "--lease-namespace="+e.ns, "--lease-label=k8s-app=konnectivity-server",
		"--kubeconfig="+the.cluster.Kubeconfig,
	)
	waitLeaseTarget(t, e.startLeaseAgents(1, e.newLB(ip)), 1, 30*time.Second)
	e.requestThroughEach(ip)
	// klog flushes its file every 5 seconds.
	assert.Eventually(t, func() bool {
		b, err := os.ReadFile(logFile)
		return err == nil && strings.Contains(string(b), "Proxy-server started")
	}, 15*time.Second, 100*time.Millisecond, "--log-file receives the log")
}

// The API server stopped for 20 seconds costs agents counting leases no
// connection and no count: the count is unknown while it is down, and the
// leases valid when it stopped count on when it is back, until their
// servers (which retry their renewals every second) have renewed them.
func TestLeasesSurviveAPIServerOutage(t *testing.T) {
	e := newEnv(t, false)
	ips := e.startServers(0, 3, e.leaseFlags("server")...)
	lb := e.newLB(ips...)
	agents := e.startLeaseAgents(2, lb)
	waitLeaseTarget(t, agents, 3, 30*time.Second)

	sampler := startMinConns(agents)
	minTarget := map[string]int{}
	paused := make(chan error, 1)
	go func() { paused <- the.cluster.PauseAPIServer(20 * time.Second) }()
	// Through the outage and the 40 seconds after it, longer than a lease:
	// the leases renewed before it expire in that time unless renewed.
	deadline := time.Now().Add(60 * time.Second)
	var pauseErr error
	for done := false; time.Now().Before(deadline); {
		for _, a := range agents {
			if tg := a.Target("leases"); minTarget[a.Name] == 0 || tg < minTarget[a.Name] {
				minTarget[a.Name] = tg
			}
		}
		if !done {
			select {
			case pauseErr = <-paused:
				done = true
			default:
			}
		}
		time.Sleep(200 * time.Millisecond) // a sampling period, not a wait for a condition
	}
	require.NoError(t, pauseErr, "restart kube-apiserver")
	mins, n := sampler.Stop()
	for _, a := range agents {
		assert.Equal(t, 3, mins[a.Name], "%s: fewest connections over %d samples", a.Name, n)
		assert.Equal(t, 3, minTarget[a.Name], "%s: lowest lease target", a.Name)
	}
	// And the count still follows the servers. A restarted API server
	// may answer the agents' first watch with 410 Expired; client-go's
	// informer then lists again only after its back-off, which the
	// outage has grown to 30-60 s, and the count stays at its last value
	// until then.
	ip := e.startServers(3, 4, e.leaseFlags("server")...)[0]
	lb.SetBackends(e.agentAddrs(append(ips, ip)...)...)
	waitLeaseTarget(t, agents, 4, 90*time.Second)
}
