package faults

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
)

// impl is one implementation's proxy-server and proxy-agent.
type impl struct {
	name          string // "ours" or "upstream"
	server, agent string
}

// certs are the matrix's CA, for the test's own agents, and its files,
// for the processes.
type certs struct {
	ca *pkitest.CA
	pkitest.Files
}

func writeCerts(t *testing.T) certs {
	t.Helper()
	ca, f := pkitest.TempFiles(t, "faults-ca")
	return certs{ca: ca, Files: f}
}

// agentTLS is the client TLS of an agent the test runs itself.
func (c certs) agentTLS(t *testing.T) *tls.Config {
	t.Helper()
	pair, err := c.ca.Client("test-agent")
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{pair.TLS}, RootCAs: c.ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// The ports of a server in a namespace of its own: the same in each, as
// in a pod. The admin port stays on the namespace's loopback.
const (
	nsAgentPort  = 8091
	nsHealthPort = 8092
)

// serverProc is a proxy-server process.
type serverProc struct {
	*proctest.Process
	id string
	// agentAddr is its agent port, host:port; metrics its /metrics URL;
	// socket its frontend (HTTP CONNECT on a Unix socket).
	agentAddr, metrics, socket string
}

// startServer starts bin as proxy-server id, telling agents there are
// count servers, in ns (nil: on loopback, on free ports). extra are more
// flags.
func startServer(t *testing.T, bin, id string, count int, ns *netNS, c certs, extra ...string) *serverProc {
	t.Helper()
	s := &serverProc{id: id, socket: filepath.Join(t.TempDir(), "frontend.sock")}
	host, agentPort, healthPort, adminPort := "127.0.0.1", nsAgentPort, nsHealthPort, 8095
	if ns != nil {
		host = ns.NSIP
	} else {
		ports := nettest.FreePorts(t, 3)
		agentPort, healthPort, adminPort = ports[0], ports[1], ports[2]
	}
	s.agentAddr = net.JoinHostPort(host, strconv.Itoa(agentPort))
	s.metrics = "http://" + net.JoinHostPort(host, strconv.Itoa(healthPort)) + "/metrics"
	// -v=0: upstream's default verbosity logs every packet.
	flags := proctest.ServerFlags{Mode: "http-connect", ID: id, Host: host, AdminHost: "127.0.0.1", Socket: s.socket,
		AgentPort: agentPort, HealthPort: healthPort, AdminPort: adminPort, Cert: c.ServerCert, Key: c.ServerKey, CA: c.CA}
	args := flags.Args(append([]string{"-v=0", "--server-count=" + strconv.Itoa(count)}, extra...)...)
	if ns != nil {
		cmd, nsArgs := ns.Exec(bin, args...)
		s.Process = proctest.Start(t, cmd, nsArgs...)
	} else {
		s.Process = proctest.Start(t, bin, args...)
	}
	s.Name = "proxy-server " + id
	waitFor(t, 30*time.Second, s.Name+" ready to serve agents", func() bool { _, err := proctest.Scrape(s.metrics); return err == nil }, s.Process)
	return s
}

// agents is how many agent streams the server holds, -1 when it cannot
// be read.
func (s *serverProc) agents() float64 {
	return value(s.metrics, "konnectivity_network_proxy_server_ready_backend_connections")
}

// agentProc is a proxy-agent process.
type agentProc struct {
	*proctest.Process
	metrics string
}

// startAgent starts bin as agent id, dialing the proxy-servers at
// localhost:port (a balancer, or a port of each server in resolved mode).
// extra are more flags.
func startAgent(t *testing.T, bin, id string, port int, c certs, extra ...string) *agentProc {
	t.Helper()
	ports := nettest.FreePorts(t, 2)
	a := &agentProc{metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])}
	flags := proctest.AgentFlags{ID: id, ServerPort: port, CA: c.CA, Cert: c.AgentCert, Key: c.AgentKey, HealthPort: ports[0], AdminPort: ports[1]}
	a.Process = proctest.Start(t, bin, flags.Args(append([]string{"-v=0"}, extra...)...)...)
	a.Name = "proxy-agent " + id
	return a
}

// held is how many servers the agent holds, -1 when it cannot be read.
func (a *agentProc) held() float64 {
	return value(a.metrics, "konnectivity_network_proxy_agent_open_server_connections")
}

// value is the sum of the samples of name at url (5 s at most for a
// black-holed server), -1 when there is none.
func value(url, name string) float64 {
	m, err := proctest.Scrape(url)
	if err != nil || m[name] == nil {
		return -1
	}
	return m.Sum(name)
}

// pollEvery is how often the matrix reads what it watches: the
// resolution of its times.
const pollEvery = 100 * time.Millisecond

// within polls cond every pollEvery until it holds, for at most d, and
// returns how long that took, or false when it never held.
func within(ctx context.Context, d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		if cond() {
			return time.Since(start), true
		}
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-tick.C:
		}
	}
}

// waitFor waits up to d for cond, failing t with what when it does not
// hold by then or one of procs exits.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, procs ...*proctest.Process) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		for _, p := range procs {
			if exited, err := p.Exited(); exited {
				t.Fatalf("%s exited (%v) while waiting for: %s\n%s", p.Name, err, what, p.Output())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(pollEvery) // a poll, not a synchronisation: cond is re-read
	}
}
