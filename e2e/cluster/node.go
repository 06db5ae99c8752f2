// Package cluster is `make cluster-e2e`: examples/kubernetes applied to a
// real one-node cluster (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd, the kubelet, CoreDNS), whose
// kube-apiserver sends its cluster egress through the proxy-server pods.
// hack/run.sh builds, starts the node (hack/up.sh), runs these tests and
// tears the node down (hack/down.sh), then checks that the machine is as
// it was. The tests skip unless run.sh started them.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/servercount/servercount/e2e/harness"
)

// The node, as hack/env.sh lays it out.
const (
	// stateDir is the node's state directory (hack/env.sh's S).
	stateDir = "/tmp/servercount-cluster-e2e/node"
	// socketDir is the servers' socket directory on the node; egressSocket
	// is the name kube-apiserver's egress selector dials there.
	socketDir    = stateDir + "/konn/uds"
	egressSocket = "konnectivity-server.socket"

	// nodeIP is the node's address (hack/env.sh's NODE_IP).
	nodeIP = "10.250.0.1"

	namespace  = "kube-system"
	deployment = "konnectivity-server"
	daemonSet  = "konnectivity-agent"
	serverApp  = "k8s-app=konnectivity-server"
	agentApp   = "k8s-app=konnectivity-agent"

	// The ports of examples/kubernetes: the servers' and agents' /metrics.
	serverAdminPort = 8095
	agentAdminPort  = 8094

	// dnsTTL is the TTL CoreDNS gives its answers (hack/up.sh's Corefile);
	// the agents keep a count that long (their cache TTL follows the
	// answer's by default).
	dnsTTL = 5 * time.Second
	// holdDown is the agents' --server-count-hold-down, the manifests'
	// default: a lower count applies only once it has lasted that long.
	holdDown = 30 * time.Second
)

// Node is the running node: kubectl and a client for it.
type Node struct {
	Kubectl    string // kubectl binary
	Kubeconfig string
	Client     kubernetes.Interface
}

// NewNode connects to the node run.sh started, from the environment it
// sets: CLUSTER_E2E_KUBECTL and CLUSTER_E2E_KUBECONFIG.
func NewNode() (*Node, error) {
	n := &Node{Kubectl: os.Getenv("CLUSTER_E2E_KUBECTL"), Kubeconfig: os.Getenv("CLUSTER_E2E_KUBECONFIG")}
	if n.Kubectl == "" || n.Kubeconfig == "" {
		return nil, fmt.Errorf("CLUSTER_E2E_KUBECTL and CLUSTER_E2E_KUBECONFIG must be set (make cluster-e2e sets them)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if n.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return n, nil
}

// Run runs kubectl with args and returns its combined output.
func (n *Node) Run(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"--kubeconfig", n.Kubeconfig, "--cache-dir", filepath.Join(stateDir, "kube-cache")}, args...)
	out, err := exec.CommandContext(ctx, n.Kubectl, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args[4:], " "), err, out)
	}
	return string(out), nil
}

// ReadyPods lists the pods of selector in ns that are Ready and not being
// deleted, oldest first: the pods the EndpointSlice controller lists as
// ready.
func (n *Node) ReadyPods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	list, err := n.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && isReady(p) && p.Status.PodIP != "" {
			ready = append(ready, p)
		}
	}
	sort.Slice(ready, func(i, j int) bool {
		return ready[i].CreationTimestamp.Before(&ready[j].CreationTimestamp)
	})
	return ready, nil
}

func isReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PointEgress makes kube-apiserver's egress socket name a link to the
// socket of a Ready server, the oldest, unless it already names one. On a
// real cluster each kube-apiserver has the server of its own node; here
// one kube-apiserver and three servers share a node, each server with a
// socket named by its pod (the overlay). It returns the pod it points at.
func (n *Node) PointEgress(ctx context.Context) (string, error) {
	pods, err := n.ReadyPods(ctx, namespace, serverApp)
	if err != nil {
		return "", err
	}
	if len(pods) == 0 {
		return "", fmt.Errorf("no Ready proxy-server pod")
	}
	link := filepath.Join(socketDir, egressSocket)
	if cur, err := os.Readlink(link); err == nil {
		for _, p := range pods {
			if cur == p.Name+".socket" {
				return p.Name, nil
			}
		}
	}
	target := pods[0].Name + ".socket"
	tmp := link + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return "", err
	}
	return pods[0].Name, os.Rename(tmp, link)
}

// ServerDials is the sum over the Ready servers of their dial counter
// (konnectivity_network_proxy_server_dial_duration_seconds_count): every
// tunnel kube-apiserver opened through them.
func (n *Node) ServerDials(ctx context.Context) (float64, error) {
	pods, err := n.ReadyPods(ctx, namespace, serverApp)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, p := range pods {
		m, err := harness.Scrape(fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, serverAdminPort))
		if err != nil {
			return 0, fmt.Errorf("server %s: %w", p.Name, err)
		}
		sum += m.Sum("konnectivity_network_proxy_server_dial_duration_seconds_count")
	}
	return sum, nil
}

// AgentCount is what one agent pod reports: the servers it holds
// (konnectivity_network_proxy_agent_open_server_connections) and counts
// through DNS (servercount_agent_target_server_count{source="dns"}).
type AgentCount struct {
	Pod string
	// Held is open_server_connections; Counted is the dns source's
	// target, and CountedFromDNS whether the agent exposes one.
	Held, Counted  float64
	CountedFromDNS bool
	// Targets lists every target_server_count series, for messages.
	Targets string
	// ScrapeError is why /metrics could not be read; the rest is then
	// empty.
	ScrapeError error
}

func (a AgentCount) String() string {
	if a.ScrapeError != nil {
		return fmt.Sprintf("%s: %v", a.Pod, a.ScrapeError)
	}
	return fmt.Sprintf("%s: holds %v, counts %v (%s)", a.Pod, a.Held, a.Counted, a.Targets)
}

// AgentCounts reads every Ready agent pod's held and counted servers.
func (n *Node) AgentCounts(ctx context.Context) ([]AgentCount, error) {
	pods, err := n.ReadyPods(ctx, namespace, agentApp)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no Ready agent pod")
	}
	var out []AgentCount
	for _, p := range pods {
		c := AgentCount{Pod: p.Name}
		m, err := harness.Scrape(fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, agentAdminPort))
		if err != nil {
			c.ScrapeError = err
			out = append(out, c)
			continue
		}
		c.Held = m.Sum("konnectivity_network_proxy_agent_open_server_connections")
		c.Counted, c.CountedFromDNS = m.Value("servercount_agent_target_server_count", "source", "dns")
		c.Targets = strings.ReplaceAll(strings.TrimSpace(m.String("servercount_agent_target_server_count")), "\n", "; ")
		out = append(out, c)
	}
	return out, nil
}

// waitFor calls check every 100 ms until it returns true or the deadline
// passes; then it returns an error naming what, with check's last
// description of the state. It returns how long it took.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func() (bool, string)) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	var last string
	for {
		ok, state := check()
		if ok {
			return time.Since(start), nil
		}
		last = state
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("%s: not within %v; last: %s", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("%s: %w; last: %s", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
