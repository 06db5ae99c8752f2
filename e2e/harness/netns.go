package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// PodCIDR is the range the suite's proxy-servers listen in, assigned to the
// loopback interface of the suite's own network namespace. kube-apiserver
// refuses loopback addresses (127.0.0.0/8) in EndpointSlices, so the
// servers cannot use 127.0.0.x as the issue planned.
const PodCIDR = "10.244.0.0/16"

// netnsEnv marks a process re-executed in its own network namespace.
const netnsEnv = "SERVERCOUNT_E2E_NETNS"

// InNetNS reports whether this process is the re-executed one, in its own
// network namespace.
func InNetNS() bool { return os.Getenv(netnsEnv) == "1" }

// RunInNetNS re-executes this program (with the same arguments, and env
// added) in a new user and network namespace, where only a loopback
// interface exists: nothing it does can reach or disturb the host's
// network. It returns the child's exit status. As root it makes only the
// network namespace; otherwise it also needs an unprivileged user
// namespace with capabilities (kernel.unprivileged_userns_clone=1, and on
// Ubuntu 24.04 kernel.apparmor_restrict_unprivileged_userns=0).
func RunInNetNS(env ...string) (int, error) {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), env...), netnsEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() != 0 {
		// Unprivileged: a user namespace gives the capabilities to
		// configure the new network namespace's loopback.
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("re-execute the suite in a new network namespace (needs user namespaces, see `sysctl kernel.unprivileged_userns_clone`): %w", err)
	}
	return 0, nil
}

// SetUpLoopback brings lo up and assigns it PodCIDR, inside the namespace
// RunInNetNS made. It runs `ip` (iproute2).
func SetUpLoopback() error {
	if !InNetNS() {
		return errors.New("refusing to change the host's loopback interface: call SetUpLoopback only under RunInNetNS")
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", PodCIDR, "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
	}
	return nil
}
