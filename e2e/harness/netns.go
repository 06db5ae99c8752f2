package harness

import "github.com/servercount/servercount/internal/netnstest"

// PodCIDR is the range the suite's proxy-servers listen in, assigned to the
// loopback interface of the suite's own network namespace. kube-apiserver
// refuses loopback addresses (127.0.0.0/8) in EndpointSlices, so the
// servers cannot use 127.0.0.x as the issue planned.
const PodCIDR = "10.244.0.0/16"

// netnsMarker marks a process re-executed in its own network namespace.
const netnsMarker = "SERVERCOUNT_E2E_NETNS"

// InNetNS reports whether this process is the re-executed one, in its own
// network namespace.
func InNetNS() bool { return netnstest.Inside(netnsMarker) }

// RunInNetNS re-executes this program (with the same arguments, and env
// added) in a new network namespace, where only a loopback interface
// exists: nothing it does can reach or disturb the host's network. It
// returns the child's exit status (see netnstest.Reexec).
func RunInNetNS(env ...string) (int, error) { return netnstest.Reexec(netnsMarker, env...) }

// SetUpLoopback brings lo up and assigns it PodCIDR, inside the namespace
// RunInNetNS made.
func SetUpLoopback() error { return netnstest.Up(netnsMarker, PodCIDR) }
