//go:build linux

// Package netnstest runs a program again in a network namespace of its
// own, where only the addresses it makes exist: a suite re-executes
// itself there so that nothing it dials can leave the machine, and what
// it configures (addresses, routes) never touches the host's network.
//
// It is Linux only and needs root, or unprivileged user namespaces.
package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/miekg/dns"
)

// Inside reports whether this process is the one Reexec started with
// marker: it runs in its own network namespace.
func Inside(marker string) bool { return os.Getenv(marker) == "1" }

// Reexec runs this program again, with the same arguments and env added,
// in a new network namespace, with marker set to 1 in its environment
// (see Inside), and returns the child's exit status. The new namespace
// holds only a loopback interface, down until Up brings it up. The child
// gets a mount namespace of its own too, for NoNames. As root it
// makes only the network namespace; otherwise it also needs an
// unprivileged user namespace with capabilities
// (kernel.unprivileged_userns_clone=1, and on Ubuntu 24.04
// kernel.apparmor_restrict_unprivileged_userns=0). The child is killed
// if this process dies.
func Reexec(marker string, env ...string) (int, error) {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), env...), marker+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() != 0 {
		// Unprivileged: a user namespace gives the capabilities to
		// configure the new network namespace.
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
		return 1, fmt.Errorf("re-execute in a new network namespace (as root, or with user namespaces: see `sysctl kernel.unprivileged_userns_clone`): %w", err)
	}
	return 0, nil
}

// Up brings the loopback interface up and assigns it the prefixes given
// (e.g. "10.244.0.0/16"), inside the namespace Reexec made with marker.
// It refuses to run anywhere else, so that it never changes the host's
// interfaces. It runs `ip` (iproute2).
func Up(marker string, prefixes ...string) error {
	if !Inside(marker) {
		return errors.New("refusing to change the host's loopback interface: call Up only in the namespace Reexec made")
	}
	cmds := [][]string{{"link", "set", "lo", "up"}}
	for _, p := range prefixes {
		cmds = append(cmds, []string{"addr", "add", p, "dev", "lo"})
	}
	return ip(cmds...)
}

// Void routes prefix into a void, inside the namespace Reexec made with
// marker: a TCP connect to an address in it hangs until its own timeout,
// as to a host that has gone silent, and no packet leaves the namespace.
// The route leads into one end of a veth pair whose other end, in the
// same namespace, has no address and does not forward, so it drops every
// packet; the sending end does no ARP, so no neighbour lookup fails the
// connect early. (An "unreachable" or "blackhole" route would fail the
// connect at once, with EHOSTUNREACH or EINVAL.)
func Void(marker, prefix string) error {
	if !Inside(marker) {
		return errors.New("refusing to change the host's routes: call Void only in the namespace Reexec made")
	}
	return ip(
		[]string{"link", "add", "void", "type", "veth", "peer", "name", "void-peer"},
		[]string{"link", "set", "void", "arp", "off"},
		// No IPv6 link-local addresses: the void carries nothing else.
		[]string{"link", "set", "void", "addrgenmode", "none"},
		[]string{"link", "set", "void-peer", "addrgenmode", "none"},
		[]string{"link", "set", "void", "up"},
		[]string{"link", "set", "void-peer", "up"},
		[]string{"route", "add", prefix, "dev", "void"},
	)
}

// Routes returns every route of the namespace, all tables, both
// families, as `ip route` prints them: for a suite to say where it runs.
func Routes() (string, error) {
	var b strings.Builder
	for _, family := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", family, "route", "show", "table", "all").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("ip %s route show table all: %w: %s", family, err, out)
		}
		b.Write(out)
	}
	return b.String(), nil
}

// ip runs `ip` once for each argument list, in order, and stops at the
// first failure.
func ip(cmds ...[]string) error {
	for _, args := range cmds {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// NoNames gives the namespace Reexec made with marker a DNS server that
// knows no names: it serves 127.0.0.1:53, over UDP and TCP, answering
// every query NXDOMAIN, and this mount namespace's /etc/resolv.conf
// points at it. A lookup then fails with "no such host", as a name that
// does not exist does on a real network, instead of going to the host's
// resolver (off the machine) or failing as unreachable. The server stops
// when the process exits.
func NoNames(marker string) error {
	if !Inside(marker) {
		return errors.New("refusing to replace the host's /etc/resolv.conf: call NoNames only in the namespace Reexec made")
	}
	nxdomain := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeNameError)
		_ = w.WriteMsg(m)
	})
	for _, network := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: "127.0.0.1:53", Net: network, Handler: nxdomain}
		started := make(chan error, 1)
		srv.NotifyStartedFunc = func() { started <- nil }
		go func() { started <- srv.ListenAndServe() }()
		if err := <-started; err != nil {
			return fmt.Errorf("serve DNS on %s 127.0.0.1:53: %w", network, err)
		}
	}
	conf, err := os.CreateTemp("", "resolv.conf")
	if err != nil {
		return err
	}
	if _, err := conf.WriteString("nameserver 127.0.0.1\n"); err != nil {
		return err
	}
	if err := conf.Close(); err != nil {
		return err
	}
	// Private first, so that the bind mount stays in this namespace
	// rather than propagating to the host's.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts of this namespace private: %w", err)
	}
	if err := syscall.Mount(conf.Name(), "/etc/resolv.conf", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over /etc/resolv.conf: %w", conf.Name(), err)
	}
	return nil
}
