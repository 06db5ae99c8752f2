package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/balancertest"
)

// The rollout an operator does to the proxy-servers and agents, with
// kube-apiserver's egress running through them as in production. A second
// kube-apiserver has an EgressSelectorConfiguration whose "cluster" egress
// is HTTPConnect over TCP with mTLS to a balancer in front of the
// servers' frontend ports; the balancer follows the servers' /readyz, as
// a Service's endpoints follow pod readiness. Short requests and streaming
// downloads go through that API server's pod proxy to a target, while
//  1. the agents are restarted one at a time, as a DaemonSet rollout does
//     (SIGTERM, the kubelet's grace period, SIGKILL, a new agent), and
//  2. the servers are replaced one at a time, as static pods are during a
//     control-plane upgrade (SIGTERM, grace period, a new server).
//
// The same scenario runs with upstream's binaries when they are available;
// their figures are logged and written to rollout.txt in the artifact
// directory, not asserted.
const (
	// rolloutStreamChunks, 100 ms apart, make a stream of 3 s: shorter
	// than every grace period below, so none may be cut.
	rolloutStreamChunks = 30
	// rolloutServerGrace is --graceful-shutdown-timeout; the kubelet's
	// grace period for a server is longer.
	rolloutServerGrace = 10 * time.Second
	// rolloutAgentGrace is the kubelet's grace period for an agent: ours
	// drains for --drain-timeout=6s and stops by itself, upstream's drains
	// until the SIGKILL.
	rolloutAgentGrace = 8 * time.Second
)

func TestEgressRollout(t *testing.T) {
	e := newEnv(t, true)
	ctx := t.Context()
	tgt := startRolloutTarget(t, e)

	front, err := balancertest.New()
	require.NoError(t, err)
	t.Cleanup(func() { front.Close() })
	egress := filepath.Join(t.TempDir(), "egress-selector.yaml")
	require.NoError(t, os.WriteFile(egress, fmt.Appendf(nil, `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: https://%s
        tlsConfig:
          caBundle: %s
          clientCert: %s
          clientKey: %s
`, front.Addr(), e.fleet.CAFile, e.fleet.FrontendCert, e.fleet.FrontendKey), 0o644))
	api, err := the.cluster.StartAPIServer("kube-apiserver-egress", "--egress-selector-config-file="+egress)
	require.NoError(t, err)
	t.Cleanup(func() {
		api.Stop()
		if t.Failed() {
			t.Logf("kube-apiserver-egress log:\n%s", api.Log(4000))
		}
	})
	client := &rolloutClient{
		tr:    &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 8},
		token: the.cluster.AdminToken,
	}
	t.Cleanup(client.tr.CloseIdleConnections)

	// The proof that every success below went through a proxy-server: the
	// first API server, without an egress selector, reaches the target
	// directly; this one, with no server behind the balancer, does not.
	direct := client.proxyURL(the.cluster.APIServerURL, e.ns, tgt.port, "short")
	require.NoError(t, client.short(ctx, direct), "the target through the API server without egress")
	require.Error(t, client.short(ctx, client.proxyURL(api.URL, e.ns, tgt.port, "short")),
		"the egress API server reached the target with no proxy-server behind its balancer")

	var report strings.Builder
	impls := []rolloutImpl{{name: "ours", server: the.bin.Server, agent: the.bin.Agent, ours: true}}
	if the.upstream.Server != "" {
		impls = append(impls, rolloutImpl{name: "upstream", server: the.upstream.Server, agent: the.upstream.Agent})
	}
	for i, impl := range impls {
		t.Run(impl.name, func(t *testing.T) {
			r := &rollout{
				t: t, e: e, impl: impl, front: front, base: 20 * i,
				client: client, url: client.proxyURL(api.URL, e.ns, tgt.port, ""),
			}
			r.run()
			fmt.Fprintf(&report, "%s\n", r.summary())
		})
	}
	if len(impls) == 1 {
		t.Log("upstream's binaries are not available: its half of the rollout did not run")
	}
	t.Logf("rollout, short requests and 3 s streams through kube-apiserver's egress:\n%s", report.String())
	if dir := t.ArtifactDir(); dir != "" {
		require.NoError(t, harness.WriteFile(dir, "rollout.txt", report.String()))
	}
}

// rolloutImpl is one pair of binaries the scenario runs.
type rolloutImpl struct {
	name          string
	server, agent string
	ours          bool
}

// rolloutTarget is the pod the requests reach: an HTTP server on a pod
// address of the test, and a Pod object with that IP.
type rolloutTarget struct {
	port int
}

// startRolloutTarget serves /short (one line) and /stream
// (rolloutStreamChunks lines 100 ms apart, then "end"), each on a new
// connection, so that every request is a new tunnel; and creates the Pod
// "target" whose status holds its address.
func startRolloutTarget(t *testing.T, e *env) *rolloutTarget {
	t.Helper()
	ip := fmt.Sprintf("10.244.%d.250", e.subnet)
	l, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("/short", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprintln(w, "short")
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := range rolloutStreamChunks {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintln(w, "end")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	ctx := t.Context()
	cs := the.cluster.Client.CoreV1()
	// Admission wants the namespace's default ServiceAccount for a Pod.
	e.createServiceAccounts("default")
	no := false
	pod, err := cs.Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "target"},
		Spec: corev1.PodSpec{
			Containers:                   []corev1.Container{{Name: "target", Image: "registry.k8s.io/pause:3.10"}},
			AutomountServiceAccountToken: &no,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	_, err = cs.Pods(e.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	return &rolloutTarget{port: l.Addr().(*net.TCPAddr).Port}
}

// rolloutClient sends requests through an API server's pod proxy.
type rolloutClient struct {
	tr    *http.Transport
	token string
}

// proxyURL is the pod proxy URL of path on the target, through the API
// server at base.
func (c *rolloutClient) proxyURL(base, ns string, port int, path string) string {
	return fmt.Sprintf("%s/api/v1/namespaces/%s/pods/target:%d/proxy/%s", base, ns, port, path)
}

// get sends GET url and returns the body, or an error for anything but a
// whole 200 response.
func (c *rolloutClient) get(ctx context.Context, url string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := (&http.Client{Transport: c.tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %.200s", resp.Status, b.String())
	}
	return b.String(), err
}

// short sends one short request to url and checks its answer.
func (c *rolloutClient) short(ctx context.Context, url string) error {
	body, err := c.get(ctx, url, 15*time.Second)
	if err == nil && body != "short\n" {
		err = fmt.Errorf("unexpected body %q", body)
	}
	return err
}

// stream sends one streaming request to url and checks that every chunk
// came.
func (c *rolloutClient) stream(ctx context.Context, url string) error {
	body, err := c.get(ctx, url, 30*time.Second)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != rolloutStreamChunks+1 || lines[len(lines)-1] != "end" {
		return fmt.Errorf("stream cut after %d of %d lines", len(lines), rolloutStreamChunks+1)
	}
	return nil
}

// rollout is one run of the scenario with one pair of binaries.
type rollout struct {
	t      *testing.T
	e      *env
	impl   rolloutImpl
	front  *balancertest.Balancer
	agents *balancertest.Balancer
	base   int // the servers are e.ip(base), e.ip(base+1)...
	client *rolloutClient
	url    string // the target's pod proxy URL, without the path

	mu      sync.Mutex // guards live
	live    []*harness.Server
	readyIP atomic.Pointer[[]string]

	phase   atomic.Int32
	results [3]phaseResult // before, agents restarted, servers replaced
}

// phaseResult counts what the load saw while one phase lasted.
type phaseResult struct {
	short, shortFailed, streams, streamsCut atomic.Int64
	mu                                      sync.Mutex
	errs                                    []string // the first few failures
}

func (p *phaseResult) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) < 5 {
		p.errs = append(p.errs, err.Error())
	}
}

var rolloutPhases = [3]string{"steady", "agent restarts", "server replacements"}

func (r *rollout) run() {
	t := r.t
	var err error
	r.agents, err = balancertest.New()
	require.NoError(t, err)
	t.Cleanup(func() { r.agents.Close() })
	followerDone := r.followReadiness()
	t.Cleanup(followerDone)

	for i := range 3 {
		r.startServer(i)
	}
	agents := make([]*harness.Agent, 3)
	for i := range agents {
		agents[i] = r.startAgent(fmt.Sprintf("%s-agent-%d", r.impl.name, i))
	}
	r.waitConverged(agents)

	stopLoad := r.startLoad()
	defer stopLoad()
	// A steady moment first, so that the load is known to work.
	r.waitRequests(0, 20)

	r.phase.Store(1)
	for i, a := range agents {
		// The kubelet: one SIGTERM, the grace period, SIGKILL.
		a.Proc.TermSignals = 1
		a.Proc.StopWithin(rolloutAgentGrace)
		agents[i] = r.startAgent(fmt.Sprintf("%s-agent-%d-new", r.impl.name, i))
		r.waitConverged(agents)
	}

	r.phase.Store(2)
	for i := range 3 {
		old := r.live[0]
		r.setLive(r.live[1:])
		old.Proc.StopWithin(rolloutServerGrace + 5*time.Second)
		r.startServer(3 + i)
		r.waitConverged(agents)
	}
	stopLoad()

	for i, name := range rolloutPhases {
		p := &r.results[i]
		t.Logf("%s, %s: %d short requests, %d failed; %d streams, %d cut; first failures: %q",
			r.impl.name, name, p.short.Load(), p.shortFailed.Load(), p.streams.Load(), p.streamsCut.Load(), p.errs)
		assert.Positive(t, p.short.Load(), "%s: no short request finished", name)
		assert.Positive(t, p.streams.Load(), "%s: no stream finished", name)
		if r.impl.ours {
			assert.Zero(t, p.shortFailed.Load(), "%s: failed short requests: %q", name, p.errs)
			assert.Zero(t, p.streamsCut.Load(), "%s: cut streams: %q", name, p.errs)
		}
	}
}

// summary is one line per phase, for the report.
func (r *rollout) summary() string {
	var b strings.Builder
	for i, name := range rolloutPhases {
		p := &r.results[i]
		fmt.Fprintf(&b, "%-8s %-20s short %5d failed %3d   streams %3d cut %2d\n",
			r.impl.name, name, p.short.Load(), p.shortFailed.Load(), p.streams.Load(), p.streamsCut.Load())
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// startServer starts server i of this run and makes it live: in the
// Service's endpoints (which publish servers that are not ready yet, so
// that agents can count and reach them) and behind the agents' balancertest.
func (r *rollout) startServer(i int) {
	fleet := *r.e.fleet
	fleet.Bin.Server = r.impl.server
	extra := []string{"--server-count=3", "--graceful-shutdown-timeout=" + rolloutServerGrace.String()}
	if r.impl.ours {
		// Long enough for the balancer to see /readyz fail (it polls
		// every 100 ms) before the frontend port closes.
		extra = append(extra, "--shutdown-delay-duration=2s")
	}
	s := fleet.StartServer(r.t, r.e.ip(r.base+i), extra...)
	r.setLive(append(slices.Clone(r.live), s))
}

// setLive makes servers the live ones: the Service's endpoints and the
// agents' balancertest. A server leaves both when it is told to stop, as a
// terminating pod leaves its Service.
func (r *rollout) setLive(servers []*harness.Server) {
	var ips, addrs []string
	for _, s := range servers {
		ips = append(ips, s.IP)
		addrs = append(addrs, s.AgentAddr())
	}
	r.mu.Lock()
	r.live = servers
	r.mu.Unlock()
	r.e.setReady(ips...)
	r.agents.SetBackends(addrs...)
}

// startAgent starts an agent that dials the servers through the agents'
// balancertest. Ours counts the servers through DNS and drains for 6 s on
// SIGTERM; upstream's takes the servers' --server-count.
func (r *rollout) startAgent(name string) *harness.Agent {
	fleet := *r.e.fleet
	fleet.Bin.Agent = r.impl.agent
	cfg := harness.AgentConfig{Name: name, DialMode: "lb", ServerAddr: r.agents.Addr(), Upstream: !r.impl.ours}
	if r.impl.ours {
		cfg.DNSName, cfg.DNSServer = r.e.svc.SRVName("agent"), the.cluster.DNS.Addr
		cfg.Extra = []string{"--drain-timeout=6s"}
	} else {
		cfg.DialMode = ""
	}
	return fleet.StartAgent(r.t, cfg)
}

// followReadiness points the frontend balancer at the live servers whose
// /readyz answers 200, every 100 ms, until the returned func is called.
func (r *rollout) followReadiness() func() {
	stop, done := make(chan struct{}), make(chan struct{})
	cl := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			r.mu.Lock()
			live := slices.Clone(r.live)
			r.mu.Unlock()
			var ready, addrs []string
			for _, s := range live {
				resp, err := cl.Get(fmt.Sprintf("http://%s/readyz", net.JoinHostPort(s.IP, strconv.Itoa(r.e.fleet.HealthPort))))
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ready = append(ready, s.IP)
					addrs = append(addrs, net.JoinHostPort(s.IP, strconv.Itoa(r.e.fleet.FrontendPort)))
				}
			}
			r.front.SetBackends(addrs...)
			r.readyIP.Store(&ready)
			select {
			case <-stop:
				r.front.SetBackends()
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop); <-done }) }
}

// waitConverged waits until every agent holds 3 connections and the 3
// live servers are ready behind the frontend balancertest.
func (r *rollout) waitConverged(agents []*harness.Agent) {
	r.t.Helper()
	for _, a := range agents {
		var conns int
		require.Eventually(r.t, func() bool {
			conns = a.Connections()
			return conns == 3
		}, 60*time.Second, 50*time.Millisecond, "%s: want 3 connections, has %d", a.Name, conns)
	}
	var ready []string
	require.Eventually(r.t, func() bool {
		if p := r.readyIP.Load(); p != nil {
			ready = *p
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(ready) != len(r.live) {
			return false
		}
		for _, s := range r.live {
			if !slices.Contains(ready, s.IP) {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "want every live server ready; ready: %v", ready)
}

// waitRequests waits until phase has seen n short requests end.
func (r *rollout) waitRequests(phase, n int) {
	r.t.Helper()
	require.Eventually(r.t, func() bool { return r.results[phase].short.Load() >= int64(n) },
		60*time.Second, 50*time.Millisecond, "fewer than %d short requests ended", n)
}

// startLoad starts two workers of short requests, 50 ms apart each, and
// two of streams back to back. Each result counts in the phase its
// request started in. The returned func lets the requests under way end
// and waits for them.
func (r *rollout) startLoad() func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(pace time.Duration, one func(p *phaseResult)) {
		defer wg.Done()
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			default:
			}
			one(&r.results[r.phase.Load()])
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}
	// Requests are not cancelled by the stop: a request under way ends
	// on its own, so that a cut is a cut.
	ctx := context.WithoutCancel(r.t.Context())
	for range 2 {
		wg.Add(2)
		go worker(50*time.Millisecond, func(p *phaseResult) {
			err := r.client.short(ctx, r.url+"short")
			p.short.Add(1)
			if err != nil {
				p.shortFailed.Add(1)
				p.fail(fmt.Errorf("short: %w", err))
			}
		})
		go worker(time.Millisecond, func(p *phaseResult) {
			err := r.client.stream(ctx, r.url+"stream")
			p.streams.Add(1)
			if err != nil {
				p.streamsCut.Add(1)
				p.fail(fmt.Errorf("stream: %w", err))
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(stop); wg.Wait() }) }
}
