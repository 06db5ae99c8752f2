package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/test/upstream"
)

// suite is what TestMain sets up once for every test: one control plane
// and our binaries. It is written before m.Run and only read after.
type suite struct {
	cluster *harness.Cluster
	bin     harness.OurBinaries
	kubectl string
	// upstream are upstream's server and agent; empty when unavailable.
	upstream upstreamBinaries
	// nextNet hands each test its own 127.0.<n>.0/24 for servers.
	nextNet atomic.Int32
}

// upstreamBinaries are upstream's proxy-server and agent.
type upstreamBinaries struct{ Server, Agent string }

// the is the shared suite; TestMain sets it before any test runs.
var the *suite

// dnsTTL is the TTL CoreDNS gives its answers; short keeps tests quick.
const dnsTTL = 1

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	if !harness.InNetNS() {
		// Build everything with the host's network (the module proxy),
		// then run the suite in a network namespace of its own.
		// Progress goes to stderr as it happens (`make e2e` runs go test
		// with -v so that it is not held back): a cold run builds for
		// many minutes, and silence looks like a hang.
		fmt.Fprintln(os.Stderr, "e2e: finding or building etcd, kube-apiserver and CoreDNS (hack/binaries.sh)")
		bins, err := harness.FindBinaries("hack/binaries.sh")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		// Everything the suite writes goes under root, which this process
		// removes whatever happens to the child (a panic or -timeout in the
		// child skips its own clean-up; its processes die with it through
		// their parent-death signal).
		root, err := os.MkdirTemp("", "servercount-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer os.RemoveAll(root)
		binDir, tmpDir, clusterDir := filepath.Join(root, "bin"), filepath.Join(root, "tmp"), filepath.Join(root, "cluster")
		for _, d := range []string{binDir, tmpDir, clusterDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				return 1
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		fmt.Fprintln(os.Stderr, "e2e: building proxy-server, proxy-agent and servercount from this repository")
		ours, err := harness.BuildOurBinaries(ctx, binDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		// Upstream's server and agent, for the side-by-side rollout; the
		// suite runs without them (that half is skipped) when there is
		// no source to build them from.
		fmt.Fprintln(os.Stderr, "e2e: finding or building upstream's proxy-server and agent (../shared/upstream)")
		up, err := upstream.Find(ctx, "..")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: upstream's half of the rollout will be skipped:", err)
		}
		fmt.Fprintf(os.Stderr, "e2e: binaries ready in %s\n", time.Since(start).Round(time.Millisecond))
		code, err := harness.RunInNetNS("TMPDIR="+tmpDir, "E2E_CLUSTER_DIR="+clusterDir,
			"E2E_ETCD="+bins.Etcd, "E2E_KUBE_APISERVER="+bins.KubeAPIServer, "E2E_KUBECTL="+bins.Kubectl, "E2E_COREDNS="+bins.CoreDNS,
			"E2E_PROXY_SERVER="+ours.Server, "E2E_PROXY_AGENT="+ours.Agent, "E2E_PROBE="+ours.Probe,
			"E2E_UPSTREAM_SERVER="+up.Server, "E2E_UPSTREAM_AGENT="+up.Agent)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
		return code
	}
	if err := harness.SetUpLoopback(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	bins := harness.Binaries{Etcd: os.Getenv("E2E_ETCD"), KubeAPIServer: os.Getenv("E2E_KUBE_APISERVER"), Kubectl: os.Getenv("E2E_KUBECTL"), CoreDNS: os.Getenv("E2E_COREDNS")}
	ours := harness.OurBinaries{Server: os.Getenv("E2E_PROXY_SERVER"), Agent: os.Getenv("E2E_PROXY_AGENT"), Probe: os.Getenv("E2E_PROBE")}
	fmt.Fprintln(os.Stderr, "e2e: starting etcd, kube-apiserver and CoreDNS in the network namespace")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := harness.StartCluster(ctx, harness.Config{Binaries: bins, DNSTTL: dnsTTL, Dir: os.Getenv("E2E_CLUSTER_DIR")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: start the control plane:", err)
		return 1
	}
	defer cluster.Close()
	fmt.Fprintf(os.Stderr, "e2e: control plane (etcd, kube-apiserver %s, CoreDNS %s) ready in %s, in a network namespace with %s on lo\n",
		cluster.APIServerURL, cluster.DNS.Addr, time.Since(start).Round(time.Millisecond), harness.PodCIDR)
	the = &suite{cluster: cluster, bin: ours, kubectl: bins.Kubectl,
		upstream: upstreamBinaries{Server: os.Getenv("E2E_UPSTREAM_SERVER"), Agent: os.Getenv("E2E_UPSTREAM_AGENT")}}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: control plane logs:\n%s\n", cluster.Logs(3000))
	}
	return code
}

// env is one test's namespace, Service, fleet and HTTP target.
type env struct {
	t       *testing.T
	ns      string
	svc     *harness.Service
	fleet   *harness.Fleet
	target  *httptest.Server
	subnet  int
	servers map[string]*harness.Server // by IP
}

// newEnv creates a namespace named after the test, a headless Service
// "proxy-server" in it with ports agent and frontend, and a fleet.
func newEnv(t *testing.T, publishNotReady bool) *env {
	t.Helper()
	ctx := t.Context()
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = strings.Trim(ns, "-")
	require.NoError(t, harness.CreateNamespace(ctx, the.cluster.Client, ns))
	fleet, err := harness.NewFleet(the.bin, t.TempDir())
	require.NoError(t, err)
	svc, err := harness.CreateHeadlessService(ctx, the.cluster.Client, harness.ServiceConfig{
		Namespace: ns, Name: "proxy-server",
		Ports:                    map[string]int32{"agent": int32(fleet.AgentPort), "frontend": int32(fleet.FrontendPort)},
		PublishNotReadyAddresses: publishNotReady,
	})
	require.NoError(t, err)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello from the target")
	}))
	t.Cleanup(target.Close)
	return &env{
		t: t, ns: ns, svc: svc, fleet: fleet, target: target,
		subnet: int(the.nextNet.Add(1)), servers: map[string]*harness.Server{},
	}
}

// ip is the address of server i of this test: 10.244.<subnet>.<10+i>,
// on the loopback interface of the suite's network namespace.
func (e *env) ip(i int) string { return fmt.Sprintf("10.244.%d.%d", e.subnet, 10+i) }

// startServers starts servers for indexes from..to-1, each with the
// flags extra, and returns their IPs.
func (e *env) startServers(from, to int, extra ...string) []string {
	e.t.Helper()
	var ips []string
	for i := from; i < to; i++ {
		ip := e.ip(i)
		e.servers[ip] = e.fleet.StartServer(e.t, ip, extra...)
		ips = append(ips, ip)
	}
	return ips
}

// stopServer stops the server on ip.
func (e *env) stopServer(ip string) {
	e.servers[ip].Stop()
	delete(e.servers, ip)
}

// setReady writes the EndpointSlice with ips, all ready.
func (e *env) setReady(ips ...string) {
	e.t.Helper()
	require.NoError(e.t, e.svc.SetEndpoints(e.t.Context(), harness.Ready(ips...)...))
}

// publishReady writes the EndpointSlice with ips, all ready, and waits
// until DNS counts them, so that agents started next count them too.
func (e *env) publishReady(ips ...string) {
	e.t.Helper()
	e.setReady(ips...)
	e.waitCount(e.svc.SRVName("agent"), len(ips))
}

// startReady starts n servers and publishes them all ready.
func (e *env) startReady(n int) []string {
	e.t.Helper()
	ips := e.startServers(0, n)
	e.publishReady(ips...)
	return ips
}

// startAgents starts n agents counting the Service's agent SRV name, in
// mode (lb goes through lb, which must be non-nil).
func (e *env) startAgents(n int, mode string, lb *balancertest.Balancer) []*harness.Agent {
	e.t.Helper()
	var agents []*harness.Agent
	for i := range n {
		cfg := harness.AgentConfig{
			Name:    fmt.Sprintf("agent-%s-%s-%d", e.ns, mode, i),
			DNSName: e.svc.SRVName("agent"), DNSServer: the.cluster.DNS.Addr, DialMode: mode,
		}
		if mode == "lb" {
			cfg.ServerAddr = lb.Addr()
		}
		agents = append(agents, e.fleet.StartAgent(e.t, cfg))
	}
	return agents
}

// agentAddrs are the fleet's agent addresses of ips, for a load balancertest.
func (e *env) agentAddrs(ips ...string) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip+":"+strconv.Itoa(e.fleet.AgentPort))
	}
	return out
}

// probe runs the probe against CoreDNS and returns the result.
func (e *env) probe(args ...string) harness.ProbeResult {
	e.t.Helper()
	r, err := e.fleet.Probe(the.cluster.DNS.Addr, args...)
	require.NoError(e.t, err)
	return r
}

// probeCount runs `servercount --short name` and returns the printed count
// and exit status.
func (e *env) probeCount(name string) (string, int) {
	r := e.probe("--short", name)
	return strings.TrimSpace(r.Output), r.Exit
}

// waitCount waits until the probe prints want for name (the answer may lag
// the EndpointSlice by CoreDNS's watch).
func (e *env) waitCount(name string, want int) {
	e.t.Helper()
	var out string
	var exit int
	require.Eventually(e.t, func() bool {
		out, exit = e.probeCount(name)
		return out == strconv.Itoa(want)
	}, 20*time.Second, 100*time.Millisecond, "probe count of %s: want %d, last output %q exit %d", name, want, out, exit)
}

// waitConnections waits until every agent holds want connections and
// targets want from DNS.
func waitConnections(t *testing.T, agents []*harness.Agent, want int, within time.Duration) {
	t.Helper()
	waitAgents(t, agents, "dns", want, want, within)
}

// waitAgents waits until every agent holds conns connections and targets
// target from source (dns or leases), and returns how long that took.
func waitAgents(t *testing.T, agents []*harness.Agent, source string, conns, target int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for _, a := range agents {
		if !assert.Eventually(t, func() bool {
			return a.Connections() == conns && a.Target(source) == target
		}, within, 50*time.Millisecond) {
			// Read again: the message's arguments would be taken before
			// the first poll.
			t.Fatalf("%s: want %d connections and %s target %d within %v; has %d connections, target %d", a.Name, conns, source, target, within, a.Connections(), a.Target(source))
		}
	}
	return time.Since(start)
}

// requestThroughEach sends a request through each server's frontend to the
// target, which the agents must tunnel.
func (e *env) requestThroughEach(ips ...string) {
	e.t.Helper()
	for _, ip := range ips {
		var body string
		var err error
		require.Eventually(e.t, func() bool {
			body, err = e.servers[ip].Get(e.target.URL + "/")
			return err == nil
		}, 10*time.Second, 100*time.Millisecond, "request through %s: %v", ip, err)
		require.Equal(e.t, "hello from the target", body, "through %s", ip)
	}
}
