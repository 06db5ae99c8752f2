package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/pkg/lease"
)

// Short lease timings, so that expiry and collection happen within seconds.
const (
	leaseDuration = 4 * time.Second
	leaseRenew    = time.Second
	leaseGC       = time.Second
)

// TestLeaseCounterAndPublisher runs pkg/lease against the real API server:
// publishers create and renew leases that the counter counts; a graceful
// stop deletes its lease at once; a lease that is no longer renewed drops
// out when it expires and is collected; a lease without
// leaseDurationSeconds is not counted and breaks nothing.
func TestLeaseCounterAndPublisher(t *testing.T) {
	ctx := t.Context()
	const ns = "lease-library"
	require.NoError(t, harness.CreateNamespace(ctx, the.cluster.Client, ns))
	leases := the.cluster.Client.CoordinationV1().Leases(ns)

	counter, err := lease.NewCounter(lease.CounterConfig{Client: leases})
	require.NoError(t, err)
	t.Cleanup(func() { _ = counter.Close() })
	countIs := func(want int, within time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool {
			res, err := counter.Count(ctx)
			return err == nil && res.Count == want
		}, within, 10*time.Millisecond, "%s: count %d", what, want)
		return time.Since(start)
	}
	require.NoError(t, counter.WaitSynced(ctx), "the first list ends")
	res, err := counter.Count(ctx)
	require.NoError(t, err, "the first list ends")
	assert.Zero(t, res.Count, "no lease yet")

	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	publish := func(id string) context.CancelFunc {
		p, err := lease.NewPublisher(lease.PublisherConfig{Client: leases, ServerID: id,
			Duration: leaseDuration, RenewInterval: leaseRenew, GCInterval: leaseGC})
		require.NoError(t, err)
		pctx, cancel := context.WithCancel(ctx)
		wg.Go(func() { _ = p.Run(pctx) })
		t.Cleanup(cancel)
		return cancel
	}
	stops := map[string]context.CancelFunc{}
	for _, id := range []string{"s1", "s2", "s3"} {
		start := time.Now()
		stops[id] = publish(id)
		if id == "s1" {
			countIs(1, 10*time.Second, "first lease")
			t.Logf("first lease counted %.2fs after its publisher started", time.Since(start).Seconds())
		}
	}
	countIs(3, 10*time.Second, "three publishers")
	// --lease-label-selector is a label selector, set-based ones too
	// (upstream's master, #868): the API server evaluates it.
	for selector, want := range map[string]int{"k8s-app in (konnectivity-server, other)": 3, "k8s-app notin (konnectivity-server)": 0} {
		sc, err := lease.NewCounter(lease.CounterConfig{Client: leases, LabelSelector: selector})
		require.NoError(t, err)
		require.NoError(t, sc.WaitSynced(ctx))
		res, err := sc.Count(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, res.Count, "leases selected by %q", selector)
		require.NoError(t, sc.Close())
	}
	// Upstream's name, spelled out: the constant is what is under test.
	l, err := leases.Get(ctx, "konnectivity-proxy-server-s1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "s1", *l.Spec.HolderIdentity)
	assert.Equal(t, int32(4), *l.Spec.LeaseDurationSeconds)
	assert.Equal(t, "konnectivity-server", l.Labels["k8s-app"])

	// A graceful stop deletes the lease: counted out well before expiry.
	stops["s3"]()
	d := countIs(2, leaseDuration/2, "graceful stop")
	t.Logf("a gracefully stopped server left the count %.2fs after its stop", d.Seconds())

	// A lease without leaseDurationSeconds is invalid; the next lease
	// proves the counter has seen it.
	now := metav1.NewMicroTime(time.Now())
	createLease(t, ns, "noduration", coordinationv1.LeaseSpec{RenewTime: &now})
	// A server killed without a graceful stop: its lease is renewed no more.
	killedAt := time.Now()
	renewed := metav1.NewMicroTime(killedAt)
	secs := int32(leaseDuration / time.Second)
	createLease(t, ns, "killed", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed"), LeaseDurationSeconds: &secs, RenewTime: &renewed, AcquireTime: &renewed})
	countIs(3, 10*time.Second, "the killed server's last lease, not the one without a duration")

	expiry := killedAt.Add(leaseDuration)
	countIs(2, 2*leaseDuration, "the killed server's lease expired")
	t.Logf("an expired lease left the count %.2fs after its expiry", time.Since(expiry).Seconds())
	require.Eventually(t, func() bool {
		_, err := leases.Get(ctx, lease.NamePrefix+"killed", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 3*leaseGC+leaseDuration, 50*time.Millisecond, "the expired lease is collected")

	// The renewed leases outlive several durations.
	assert.Never(t, func() bool {
		res, err := counter.Count(ctx)
		return err != nil || res.Count != 2
	}, leaseDuration+leaseRenew, 100*time.Millisecond, "renewed leases stay valid")
}

// createLease creates the lease of server id in ns with spec and the
// label servers give theirs, as a server that no longer renews it left it.
func createLease(t *testing.T, ns, id string, spec coordinationv1.LeaseSpec) {
	t.Helper()
	_, err := the.cluster.Client.CoordinationV1().Leases(ns).Create(t.Context(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lease.NamePrefix + id, Labels: map[string]string{"k8s-app": "konnectivity-server"}},
		Spec:       spec,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

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
func (e *env) startLeaseAgents(n int, lb *balancertest.Balancer) []*harness.Agent {
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
	createLease(t, e.ns, "noduration", coordinationv1.LeaseSpec{RenewTime: &now, AcquireTime: &now})
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
			tg := a.Target("leases")
			if low, seen := minTarget[a.Name]; !seen || tg < low {
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
