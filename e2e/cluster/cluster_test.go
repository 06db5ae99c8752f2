package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// overlayDir is the kustomize overlay of examples/kubernetes.
func overlayDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "overlay")
}

// TestCluster runs in order, on the node run.sh started: the manifests
// applied, kube-apiserver's logs, exec and port-forward through the pods
// (and not without the agents), the server Deployment scaled 1 -> 3 -> 2
// with every agent following, the probe in a pod counting as they do, a
// rollout restart of the servers followed by every agent, and the
// EndpointSlices written by their controller only.
func TestCluster(t *testing.T) {
	if os.Getenv("CLUSTER_E2E_KUBECONFIG") == "" {
		t.Skip("needs the node of make cluster-e2e (e2e/cluster/hack/run.sh)")
	}
	n, err := NewNode()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if !t.Run("Apply", func(t *testing.T) { testApply(ctx, t, n) }) {
		t.FailNow()
	}
	t.Run("Tunnel", func(t *testing.T) { testTunnel(ctx, t, n) })
	t.Run("NoAgent", func(t *testing.T) { testNoAgent(ctx, t, n) })
	t.Run("Scale", func(t *testing.T) { testScale(ctx, t, n) })
	t.Run("Probe", func(t *testing.T) { testProbe(ctx, t, n) })
	t.Run("RolloutRestart", func(t *testing.T) { testRolloutRestart(ctx, t, n) })
	t.Run("EndpointSlicesByController", func(t *testing.T) { testSlicesByController(ctx, t, n) })
	t.Run("Listeners", func(t *testing.T) { testListeners(ctx, t) })
}

// testApply applies the overlay and waits for the three servers and the
// agent to be Ready and for the agent to hold the three.
func testApply(ctx context.Context, t *testing.T, n *Node) {
	start := time.Now()
	if out, err := n.Run(ctx, "apply", "-k", overlayDir()); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("applied:\n%s", out)
	}
	for _, obj := range []string{"deploy/" + deployment, "ds/" + daemonSet} {
		if _, err := n.Run(ctx, "-n", namespace, "rollout", "status", obj, "--timeout=120s"); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := n.PointEgress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver's egress socket: %s's", pod)
	took, err := waitAgents(ctx, n, 3, 3, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3 servers and the agent Ready, the agent holding 3, %.1fs after apply (agent %.1fs after the rollout)",
		time.Since(start).Seconds(), took.Seconds())
}

// waitAgents waits until every Ready agent pod holds held servers and
// counts counted through DNS.
func waitAgents(ctx context.Context, n *Node, held, counted float64, timeout time.Duration) (time.Duration, error) {
	return waitFor(ctx, timeout, fmt.Sprintf("every agent holding %v and counting %v servers", held, counted), func() (bool, string) {
		return agentsAgree(ctx, n, func(c AgentCount) bool {
			return c.Held == held && c.CountedFromDNS && c.Counted == counted
		})
	})
}

const workload = `apiVersion: v1
kind: Namespace
metadata: {name: cluster-e2e}
---
apiVersion: v1
kind: Pod
metadata: {name: workload, namespace: cluster-e2e}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: workload
    image: servercount.local/busybox:e2e
    # Loaded into containerd; never pulled.
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /tmp/www && echo port-forward-ok > /tmp/www/index.html && echo workload-started && exec httpd -f -p 8080 -h /tmp/www"]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`

// testTunnel: kubectl logs, exec and port-forward to a pod, which
// kube-apiserver reaches only through its egress (the proxy-server pods
// and the agent pod); the servers' dial counter rises by at least one per
// exec and port-forward.
func testTunnel(ctx context.Context, t *testing.T, n *Node) {
	cmd := exec.CommandContext(ctx, n.Kubectl, "--kubeconfig", n.Kubeconfig, "--cache-dir", filepath.Join(stateDir, "kube-cache"), "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(workload)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apply the workload: %v: %s", err, out)
	}
	if _, err := n.Run(ctx, "-n", "cluster-e2e", "wait", "--for=condition=Ready", "pod/workload", "--timeout=60s"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.PointEgress(ctx); err != nil {
		t.Fatal(err)
	}
	d0, err := n.ServerDials(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := n.Run(ctx, "-n", "cluster-e2e", "logs", "workload", "--request-timeout=20s")
	if err != nil || !strings.Contains(out, "workload-started") {
		t.Errorf("kubectl logs: %q, %v", out, err)
	} else {
		t.Logf("kubectl logs: ok (%.2fs)", time.Since(start).Seconds())
	}
	start = time.Now()
	out, err = n.Run(ctx, "-n", "cluster-e2e", "exec", "workload", "--request-timeout=20s", "--", "echo", "exec-ok")
	if err != nil || strings.TrimSpace(out) != "exec-ok" {
		t.Errorf("kubectl exec: %q, %v", out, err)
	} else {
		t.Logf("kubectl exec: ok (%.2fs)", time.Since(start).Seconds())
	}
	start = time.Now()
	if body, err := portForward(ctx, n); err != nil || strings.TrimSpace(body) != "port-forward-ok" {
		t.Errorf("kubectl port-forward: %q, %v", body, err)
	} else {
		t.Logf("kubectl port-forward: ok (%.2fs)", time.Since(start).Seconds())
	}
	var d1 float64
	// The servers count a dial when the agent has answered it; the
	// counter may trail the command by a moment.
	if _, err := waitFor(ctx, 10*time.Second, "the servers' dial counter to rise by 2 (exec, port-forward)", func() (bool, string) {
		d1, err = n.ServerDials(ctx)
		return err == nil && d1-d0 >= 2, fmt.Sprintf("%v -> %v (%v)", d0, d1, err)
	}); err != nil {
		t.Error(err)
	}
	t.Logf("the servers' dials: %v -> %v (+%v) for logs, exec and port-forward", d0, d1, d1-d0)
}

var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// portForward runs kubectl port-forward to the workload's port 8080 on a
// free local port and GETs / through it.
func portForward(ctx context.Context, n *Node) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Kubectl, "--kubeconfig", n.Kubeconfig, "--cache-dir", filepath.Join(stateDir, "kube-cache"),
		"-n", "cluster-e2e", "port-forward", "--address=127.0.0.1", "pod/workload", "0:8080")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwarding.FindStringSubmatch(sc.Text()); m != nil {
				port <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var p string
	select {
	case p = <-port:
	case <-ctx.Done():
		return "", fmt.Errorf("no local port from kubectl port-forward: %w", ctx.Err())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+p+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// testScale scales the server Deployment 1 -> 3 -> 2 with kubectl. After
// each change has reached the pods (as many Ready servers as replicas,
// none terminating), every agent must hold exactly that many within the
// DNS TTL + 5 s, and count that many within the same time after an
// increase, and within TTL + the hold-down + 5 s after a decrease (the
// hold-down delays a lower count on purpose).
func testScale(ctx context.Context, t *testing.T, n *Node) {
	prev := 3.0
	for _, replicas := range []int{1, 3, 2} {
		want := float64(replicas)
		if _, err := n.Run(ctx, "-n", namespace, "scale", "deploy/"+deployment, fmt.Sprintf("--replicas=%d", replicas)); err != nil {
			t.Fatal(err)
		}
		scaled := time.Now()
		if err := waitServerPods(ctx, n, replicas); err != nil {
			t.Fatal(err)
		}
		podsAt := time.Now()
		if pod, err := n.PointEgress(ctx); err != nil {
			t.Fatal(err)
		} else {
			t.Logf("replicas %d: pods settled %.1fs after kubectl scale; egress socket: %s's", replicas, podsAt.Sub(scaled).Seconds(), pod)
		}
		heldWithin := dnsTTL + 5*time.Second
		countedWithin := heldWithin
		if want < prev {
			countedWithin += holdDown
		}
		took, err := waitFor(ctx, heldWithin, fmt.Sprintf("every agent holding %v servers", want), func() (bool, string) {
			return agentsAgree(ctx, n, func(c AgentCount) bool { return c.Held == want })
		})
		if err != nil {
			t.Error(err)
		} else {
			t.Logf("replicas %d: every agent holds %v, %.1fs after the pods settled (bound %v)", replicas, want, took.Seconds(), heldWithin)
		}
		_, err = waitFor(ctx, countedWithin-time.Since(podsAt), fmt.Sprintf("every agent counting %v servers through DNS", want), func() (bool, string) {
			return agentsAgree(ctx, n, func(c AgentCount) bool { return c.CountedFromDNS && c.Counted == want && c.Held == want })
		})
		if err != nil {
			t.Error(err)
		} else {
			t.Logf("replicas %d: every agent counts %v, %.1fs after the pods settled (bound %v)", replicas, want, time.Since(podsAt).Seconds(), countedWithin)
		}
		prev = want
	}
}

// waitServerPods waits until the server pods are replicas Ready pods and
// no other (none starting, none terminating).
func waitServerPods(ctx context.Context, n *Node, replicas int) error {
	_, err := waitFor(ctx, 120*time.Second, fmt.Sprintf("%d Ready server pods and no other", replicas), func() (bool, string) {
		list, err := n.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: serverApp})
		if err != nil {
			return false, err.Error()
		}
		ready, err := n.ReadyPods(ctx, namespace, serverApp)
		if err != nil {
			return false, err.Error()
		}
		return len(ready) == replicas && len(list.Items) == replicas,
			fmt.Sprintf("%d pods, %d Ready", len(list.Items), len(ready))
	})
	return err
}

// testRolloutRestart: `kubectl rollout restart` of the servers replaces
// each pod (one at a time: maxSurge 0, maxUnavailable 1). Once only new
// pods are left, all Ready, every agent holds and counts them within the
// DNS TTL + 5 s, and kube-apiserver's egress works through a new server.
func testRolloutRestart(ctx context.Context, t *testing.T, n *Node) {
	before, err := n.ReadyPods(ctx, namespace, serverApp)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]bool{}
	for _, p := range before {
		old[p.Name] = true
	}
	start := time.Now()
	if _, err := n.Run(ctx, "-n", namespace, "rollout", "restart", "deploy/"+deployment); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Run(ctx, "-n", namespace, "rollout", "status", "deploy/"+deployment, "--timeout=180s"); err != nil {
		t.Fatal(err)
	}
	if err := waitServerPods(ctx, n, len(before)); err != nil {
		t.Fatal(err)
	}
	podsAt := time.Now()
	after, err := n.ReadyPods(ctx, namespace, serverApp)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range after {
		if old[p.Name] {
			t.Fatalf("server pod %s survived the rollout restart", p.Name)
		}
	}
	t.Logf("rollout restart: %d new server pods, the old gone, %.1fs after kubectl rollout restart", len(after), podsAt.Sub(start).Seconds())
	want := float64(len(after))
	bound := dnsTTL + 5*time.Second
	took, err := waitFor(ctx, bound, fmt.Sprintf("every agent holding and counting the %v new servers", want), func() (bool, string) {
		return agentsAgree(ctx, n, func(c AgentCount) bool { return c.Held == want && c.CountedFromDNS && c.Counted == want })
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout restart: every agent holds and counts %v, %.1fs after the pods settled (bound %v)", want, took.Seconds(), bound)
	pod, err := n.PointEgress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := n.Run(ctx, "-n", "cluster-e2e", "exec", "workload", "--request-timeout=20s", "--", "echo", "exec-ok"); err != nil || strings.TrimSpace(out) != "exec-ok" {
		t.Errorf("kubectl exec through the new server %s: %q, %v", pod, out, err)
	}
}

// agentsAgree reports whether every Ready agent pod passes ok, and the
// agents' state.
func agentsAgree(ctx context.Context, n *Node, ok func(AgentCount) bool) (bool, string) {
	counts, err := n.AgentCounts(ctx)
	if err != nil {
		return false, err.Error()
	}
	all := true
	var desc []string
	for _, c := range counts {
		desc = append(desc, c.String())
		if c.ScrapeError != nil || !ok(c) {
			all = false
		}
	}
	return all, strings.Join(desc, "; ")
}

// testSlicesByController: the headless Service's EndpointSlices were
// written by the EndpointSlice controller alone (their managed fields name
// no other writer): the counts above came from the real chain.
func testSlicesByController(ctx context.Context, t *testing.T, n *Node) {
	slices, err := n.Client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + deployment})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) == 0 {
		t.Fatal("no EndpointSlice for the konnectivity-server Service")
	}
	for _, s := range slices.Items {
		if by := s.Labels["endpointslice.kubernetes.io/managed-by"]; by != "endpointslice-controller.k8s.io" {
			t.Errorf("EndpointSlice %s managed by %q", s.Name, by)
		}
		for _, f := range s.ManagedFields {
			// The manager is the controller-manager's program name:
			// kube-controller-manager-<version> as the cache names it.
			if !strings.HasPrefix(f.Manager, "kube-controller-manager") {
				t.Errorf("EndpointSlice %s has fields written by %q", s.Name, f.Manager)
			}
		}
		t.Logf("EndpointSlice %s: %d endpoints, written by %v", s.Name, len(s.Endpoints), managers(s.ManagedFields))
	}
}

func managers(fields []metav1.ManagedFieldsEntry) []string {
	var m []string
	for _, f := range fields {
		m = append(m, f.Manager)
	}
	return m
}

// testNoAgent: with the agent DaemonSet deleted, kubectl exec fails with
// the server's "No agent available" (kube-apiserver has no other way to
// the pod); with it applied again, exec works once the agent is back.
func testNoAgent(ctx context.Context, t *testing.T, n *Node) {
	if _, err := n.Run(ctx, "-n", namespace, "delete", "ds/"+daemonSet, "--wait=true", "--timeout=60s"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Run(ctx, "-n", namespace, "wait", "--for=delete", "pod", "-l", agentApp, "--timeout=60s"); err != nil {
		t.Fatal(err)
	}
	out, err := n.Run(ctx, "-n", "cluster-e2e", "exec", "workload", "--request-timeout=20s", "--", "echo", "exec-ok")
	if err == nil {
		t.Errorf("kubectl exec worked with no agent: %q", out)
	} else if !strings.Contains(out, "No agent available") {
		t.Errorf("kubectl exec with no agent: want \"No agent available\", got %v", err)
	} else {
		t.Logf("with no agent, kubectl exec fails: %s", strings.TrimSpace(out))
	}
	if _, err := n.Run(ctx, "apply", "-k", overlayDir()); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	took, err := waitFor(ctx, 90*time.Second, "kubectl exec with the agent back", func() (bool, string) {
		out, err := n.Run(ctx, "-n", "cluster-e2e", "exec", "workload", "--request-timeout=10s", "--", "echo", "exec-ok")
		return err == nil && strings.TrimSpace(out) == "exec-ok", out
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent DaemonSet applied again: kubectl exec works %.1fs later", took.Seconds())
	if _, err := waitAgents(ctx, n, 3, 3, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("the new agent holds 3 servers %.1fs after the apply", time.Since(applied).Seconds())
}

// testProbe runs the servercount probe in a pod of another namespace, on
// the Service's short name: the pod's resolv.conf (search list, ndots:5)
// makes it konnectivity-server.kube-system.svc.cluster.local. It must
// print the count of Ready servers, as the agents count.
func testProbe(ctx context.Context, t *testing.T, n *Node) {
	ready, err := n.ReadyPods(ctx, namespace, serverApp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Run(ctx, "-n", "cluster-e2e", "run", "probe", "--restart=Never", "--image=servercount.local/servercount:e2e",
		"--image-pull-policy=Never", "--", "--short", "konnectivity-server.kube-system"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Run(ctx, "-n", "cluster-e2e", "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/probe", "--timeout=60s"); err != nil {
		out, _ := n.Run(ctx, "-n", "cluster-e2e", "logs", "probe")
		t.Fatalf("%v; the probe printed: %s", err, out)
	}
	out, err := n.Run(ctx, "-n", "cluster-e2e", "logs", "probe")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out), fmt.Sprint(len(ready)); got != want {
		t.Errorf("the probe in a pod printed %q, want %s (the Ready servers)", got, want)
	} else {
		t.Logf("the probe in a pod counts %s servers, as many as are Ready", got)
	}
}

// testListeners: every socket the node's daemons listen on in the
// machine's network namespace (ss, by the PIDs up.sh kept) is bound to
// loopback or the node address, never to every address.
func testListeners(ctx context.Context, t *testing.T) {
	pids := map[string]string{}
	entries, err := os.ReadDir(filepath.Join(stateDir, "pids"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(stateDir, "pids", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		pids[strings.TrimSpace(string(b))] = e.Name()
	}
	out, err := exec.CommandContext(ctx, "ss", "-Hlntup").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	pidOf := regexp.MustCompile(`pid=(\d+)`)
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		var who string
		for _, m := range pidOf.FindAllStringSubmatch(f[6], -1) {
			if name, ok := pids[m[1]]; ok {
				who = name
			}
		}
		if who == "" {
			continue
		}
		seen++
		local := f[4]
		host := local[:strings.LastIndexByte(local, ':')]
		switch strings.Trim(host, "[]") {
		case "127.0.0.1", "::1", nodeIP:
		default:
			t.Errorf("%s listens on %s (%s)", who, local, f[0])
		}
	}
	if seen == 0 {
		t.Fatal("no listener of the node's daemons found")
	}
	t.Logf("%d listeners of the node's daemons, all on loopback or %s", seen, nodeIP)
}
