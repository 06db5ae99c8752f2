// Package harness runs a real control plane (etcd, kube-apiserver and
// CoreDNS with its kubernetes plugin) and our proxy-servers and agents as
// local processes on loopback, for the end-to-end suite.
//
// Every process runs under internal/proctest: in its own process group,
// with SIGKILL as its parent death signal, and is stopped (the whole group) by Close/Stop or by the
// test's cleanup, also when a test fails.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/servercount/servercount/internal/proctest"
)

// Process is a program the harness started: proctest's runner, in its
// own process group, its output in a log file. The alias keeps the
// harness's fields (Agent.Proc and the like) readable as harness types.
type Process = proctest.Process

// Binaries are the programs of the control plane.
type Binaries struct {
	Etcd, KubeAPIServer, Kubectl, CoreDNS string
}

// FindBinaries runs script (e2e/hack/binaries.sh), which builds and caches
// kube-apiserver, kubectl and CoreDNS once and prints the cache directory, and
// returns their paths. Versions come from KUBE_VERSION and COREDNS_VERSION
// as in the script.
func FindBinaries(script string) (Binaries, error) {
	cmd := exec.Command("bash", script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("run %s to build the control plane binaries: %w", script, err)
	}
	cache := strings.TrimSpace(string(out))
	kube, dns := os.Getenv("KUBE_VERSION"), os.Getenv("COREDNS_VERSION")
	if kube == "" {
		kube = "v1.37.2"
	}
	if dns == "" {
		dns = "v1.15.0"
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		return Binaries{}, fmt.Errorf("find etcd (apt-get install etcd-server): %w", err)
	}
	b := Binaries{
		Etcd:          etcd,
		KubeAPIServer: filepath.Join(cache, "bin", "kube-apiserver-"+kube),
		Kubectl:       filepath.Join(cache, "bin", "kubectl-"+kube),
		CoreDNS:       filepath.Join(cache, "bin", "coredns-"+dns),
	}
	for _, f := range []string{b.KubeAPIServer, b.Kubectl, b.CoreDNS} {
		if _, err := os.Stat(f); err != nil {
			return Binaries{}, fmt.Errorf("%s did not leave %s: %w", script, f, err)
		}
	}
	return b, nil
}

// waitFor polls ready every 100ms until it returns nil, the process exits,
// or timeout passes.
func waitFor(p *Process, timeout time.Duration, what string, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = ready(); last == nil {
			return nil
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited (%v) before %s; its log:\n%s", p.Name, err, what, p.Log(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not %s within %s: %w; its log:\n%s", p.Name, what, timeout, last, p.Log(4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
