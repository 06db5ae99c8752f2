package faults

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// netNS is a network namespace joined to the test's by a veth pair on a
// /30 of its own: the test's end is HostIP, the namespace's NSIP. What
// listens in it on NSIP is reached from the test's namespace, and only
// through the pair, so that blackhole routes at both ends cut it off.
type netNS struct {
	name, hostIf string
	HostIP, NSIP string

	mu      sync.Mutex // guards holed
	holed   bool
	cleanup sync.Once
}

// nsSeq numbers the namespaces of this process: names, interfaces and
// subnets are unique to it.
var nsSeq atomic.Int32

// newNetNS makes a namespace with its loopback up and the veth pair, and
// deletes it when t ends.
func newNetNS(t *testing.T) *netNS {
	t.Helper()
	i := nsSeq.Add(1)
	if i > 250 {
		t.Fatal("more than 250 network namespaces in one run")
	}
	tag := fmt.Sprintf("%d%c", os.Getpid()%100000, 'a'+rune(i%26))
	n := &netNS{
		name:   fmt.Sprintf("scf-%s-%d", tag, i),
		hostIf: fmt.Sprintf("scf%dh%d", os.Getpid()%10000, i),
		HostIP: fmt.Sprintf("10.213.%d.1", i),
		NSIP:   fmt.Sprintf("10.213.%d.2", i),
	}
	nsIf := fmt.Sprintf("scf%dn%d", os.Getpid()%10000, i)
	t.Cleanup(n.delete)
	for _, args := range [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", n.name},
		{"addr", "add", n.HostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.name, "addr", "add", n.NSIP + "/30", "dev", nsIf},
		{"-n", n.name, "link", "set", nsIf, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
	} {
		mustIP(t, args...)
	}
	return n
}

// Exec returns the command line that runs bin with args in the
// namespace.
func (n *netNS) Exec(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", n.name, bin}, args...)
}

// BlackHole drops every packet between the namespace and the test's,
// both ways, without a word to either end: what a dead node or a cut
// link does.
func (n *netNS) BlackHole(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	mustIP(t, "route", "add", "blackhole", n.NSIP+"/32")
	mustIP(t, "-n", n.name, "route", "add", "blackhole", n.HostIP+"/32")
	n.holed = true
}

// Heal takes the black hole away.
func (n *netNS) Heal(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.holed {
		return
	}
	mustIP(t, "route", "del", "blackhole", n.NSIP+"/32")
	mustIP(t, "-n", n.name, "route", "del", "blackhole", n.HostIP+"/32")
	n.holed = false
}

// delete removes the namespace, the veth pair with it, and the test's
// blackhole route.
func (n *netNS) delete() {
	n.cleanup.Do(func() {
		n.mu.Lock()
		if n.holed {
			_ = exec.Command("ip", "route", "del", "blackhole", n.NSIP+"/32").Run()
		}
		n.mu.Unlock()
		_ = exec.Command("ip", "netns", "del", n.name).Run()
	})
}

// mustIP runs ip with args and fails t when it fails.
func mustIP(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// canMakeNamespaces reports why the matrix cannot make network
// namespaces here, or "" when it can.
func canMakeNamespaces() string {
	if os.Geteuid() != 0 {
		return "the fault matrix makes network namespaces and routes: run it as root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "the fault matrix needs ip (iproute2): " + err.Error()
	}
	return ""
}
