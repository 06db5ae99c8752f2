package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestProbeAgainstDnsmasq runs the built probe against dnsmasq, a DNS
// server this project did not write, serving a 3-replica headless-style
// name. CI installs dnsmasq; elsewhere the test is skipped without it.
func TestProbeAgainstDnsmasq(t *testing.T) {
	dnsmasq, err := exec.LookPath("dnsmasq")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("dnsmasq is not installed; .ci/run installs it with apt-get install dnsmasq-base")
		}
		t.Skip("dnsmasq not installed (apt-get install dnsmasq-base)")
	}
	bin := proctest.Build(t, "cmd/servercount")

	addr := startDnsmasq(t, dnsmasq, `
127.0.0.11 proxy.test.svc.cluster.local
127.0.0.12 proxy.test.svc.cluster.local
127.0.0.13 proxy.test.svc.cluster.local
`, "--srv-host=_agent._tcp.proxy.test.svc.cluster.local,p1.proxy.test.svc.cluster.local,8091",
		"--srv-host=_agent._tcp.proxy.test.svc.cluster.local,p2.proxy.test.svc.cluster.local,8091",
		"--srv-host=_agent._tcp.proxy.test.svc.cluster.local,p3.proxy.test.svc.cluster.local,8091")

	probe := func(args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, args...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("run probe: %v", err)
		}
		return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
	}

	code, out, errOut := probe("@"+addr, "proxy.test.svc.cluster.local.")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, ";; COUNT: 3, outcome: records, rcode: NOERROR")

	code, out, errOut = probe("@"+addr, "--short", "_agent._tcp.proxy.test.svc.cluster.local.")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "3\n", out)

	code, out, errOut = probe("@"+addr, "gone.test.svc.cluster.local.")
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, out, "outcome: nxdomain, rcode: NXDOMAIN")

	// A server that is down: nothing listens on the port any more.
	down := freeAddr(t)
	start := time.Now()
	code, _, errOut = probe("@"+down, "--timeout", "2s", "proxy.test.svc.cluster.local.")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "servercount: count servers at proxy.test.svc.cluster.local.: ")
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "one error line: %q", errOut)
	assert.Less(t, time.Since(start), 2*time.Second+time.Second, "exits within --timeout (plus process start)")

	// A server that takes the query and never answers: each of the
	// --attempts waits --timeout, as dig's +tries and +timeout.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	start = time.Now()
	code, _, errOut = probe("@"+silent.LocalAddr().String(), "--timeout", "500ms", "--attempts", "2", "proxy.test.svc.cluster.local.")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "timed out")
	// Not a speed check: a bound that shows the default 5s was not used.
	assert.Less(t, time.Since(start), 2*500*time.Millisecond+2*time.Second, "exits within attempts x timeout (plus process start)")
}

// startDnsmasq runs dnsmasq on a free loopback port, authoritative for
// cluster.local (unknown names there are NXDOMAIN, nothing is forwarded),
// with hosts as its only hosts file. It returns the address once dnsmasq
// answers, and stops it when the test ends.
func startDnsmasq(t *testing.T, bin, hosts string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	hostsFile := filepath.Join(dir, "hosts")
	require.NoError(t, os.WriteFile(hostsFile, []byte(hosts), 0o644))
	for try := 0; try < 5; try++ {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		args := append([]string{
			"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--listen-address=127.0.0.1", "--bind-interfaces", "--port=" + port,
			"--addn-hosts=" + hostsFile, "--local=/cluster.local/", "--pid-file=", "--user=" + currentUser(),
		}, extra...)
		p := proctest.Start(t, bin, args...)
		if err := waitForDNS(addr, p); err != nil {
			p.Kill()
			t.Logf("dnsmasq on %s did not start (%v): %s", addr, err, p.Output())
			continue
		}
		return addr
	}
	t.Fatal("dnsmasq did not start")
	return ""
}

// waitForDNS waits until addr answers a query, dnsmasq exits, or 10s pass.
func waitForDNS(addr string, p *proctest.Process) error {
	deadline := time.Now().Add(10 * time.Second)
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	m := new(dns.Msg).SetQuestion("proxy.test.svc.cluster.local.", dns.TypeA)
	for time.Now().Before(deadline) {
		if exited, err := p.Exited(); exited && err != nil {
			return fmt.Errorf("exited: %w", err)
		} else if exited {
			return errors.New("exited with status 0")
		}
		if _, _, err := c.Exchange(m, addr); err == nil {
			return nil
		}
		select {
		case <-p.Done():
		case <-time.After(20 * time.Millisecond): // poll interval, not synchronisation
		}
	}
	return errors.New("no answer within 10s")
}

// freeAddr returns a loopback address whose UDP and TCP ports were free a
// moment ago: a DNS server listens on both.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	require.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "root"
}
