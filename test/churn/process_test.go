package churn_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
	"github.com/servercount/servercount/test/upstream"
)

// processDuration turns the process runs on (`make churn`): each of the
// eight runs lasts this long. They are off in `make test`, whose churn
// runs in one process (internal/proxytest TestChurn).
var processDuration = flag.Duration("churn.process-duration", 0, "run TestChurnProcesses, each run this long (make churn: 60s)")

// binaries are one side's proxy-server and proxy-agent.
type binaries struct {
	name          string
	server, agent string
}

// The churn through the binaries as processes, mTLS between
// agent and server, frontends over a Unix socket as kube-apiserver's, in
// all four pairings of our server and agent with upstream's, in both
// frontend modes. Each of our halves must hold against upstream's other
// half: no lock-up, and a new tunnel gets its first byte at any moment.
// On the main of 2026-12-04 our halves locked up in every pairing but
// ours with upstream's agent in gRPC mode, within about a second.
//
// Runs with an upstream half are gentle (no slow readers: see
// churn.Config.Gentle). Upstream's own pair is run as the oracle and
// reported, not held to the test: in gRPC mode it locks up under this
// churn by itself (its short tunnels closed by their endpoint while the
// frontend still writes), which no half of ours is part of.
func TestChurnProcesses(t *testing.T) {
	if *processDuration == 0 {
		t.Skip("the process runs take minutes: make churn (go test -run TestChurnProcesses ./test/churn -churn.process-duration=60s)")
	}
	up := upstream.Require(t)
	ours := binaries{"ours", proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")}
	theirs := binaries{"upstream", up.Server, up.Agent}
	certs := writeCerts(t)
	targets := churn.StartTargets(t)
	// The runs that kept making progress, by pairing and mode.
	progressed := map[string]churn.Result{}
	for _, srv := range []binaries{ours, theirs} {
		for _, ag := range []binaries{ours, theirs} {
			for _, mode := range []string{"http-connect", "grpc"} {
				name := fmt.Sprintf("server=%s/agent=%s/mode=%s", srv.name, ag.name, mode)
				t.Run(name, func(t *testing.T) {
					dial := churn.OverUnix(mode, startPair(t, srv.server, ag.agent, mode, certs).socket)
					gentle := srv.name != "ours" || ag.name != "ours"
					res, err := churn.Run(t.Context(), churn.Config{Dial: dial, Targets: targets, Duration: *processDuration, Gentle: gentle})
					t.Logf("%v; first tunnel error: %v; failed tunnels by error: %v", res, res.FirstError, res.Errors)
					t.Logf("frontend closes: %v; endpoint closes: %v", res.FrontendCloses, res.EndpointCloses)
					if err == nil {
						progressed[name] = res
					}
					if srv.name != "ours" && ag.name != "ours" {
						t.Logf("upstream's own pair, the oracle (not held to the test): lock-up: %v", err)
						return
					}
					require.NoError(t, err)
					require.Positive(t, res.Probes)
				})
			}
		}
	}
	// Behind upstream's server, what share of tunnels each agent fails,
	// in the same churn: reported, not held. Every failure is upstream's
	// server's: in HTTP-CONNECT mode it closes the client's connection on
	// the agent's CLOSE_RSP with the client's last bytes unread, which
	// resets the client. Nearly every endpoint close meets it, whichever
	// the agent (98-99 % with ours, 99-100 % with upstream's, three runs
	// of 20 s, 2026-12-07); no frontend close does. The share of all
	// tunnels tried (about 46 %, 41-47 % with upstream's agent) follows
	// the mix of the two kinds, not the agent's failures: compare the
	// endpoint closes.
	all := func(r churn.Result) churn.ShortCount { return churn.ShortCount{Finished: r.Tunnels, Failed: r.Failed} }
	for _, mode := range []string{"http-connect", "grpc"} {
		mine, okMine := progressed["server=upstream/agent=ours/mode="+mode]
		theirs, okTheirs := progressed["server=upstream/agent=upstream/mode="+mode]
		switch {
		case !okMine:
			continue // failed above
		case !okTheirs:
			t.Logf("%s, behind upstream's server: with our agent %v of the tunnels tried, %v of the endpoint closes; upstream's own pair locked up", mode,
				all(mine), mine.EndpointCloses)
			continue
		}
		t.Logf("%s, behind upstream's server: of the tunnels tried, with our agent %v, with upstream's %v; of the endpoint closes, ours %v, upstream's %v", mode,
			all(mine), all(theirs), mine.EndpointCloses, theirs.EndpointCloses)
	}
}

func writeCerts(t *testing.T) pkitest.Files {
	t.Helper()
	_, f := pkitest.TempFiles(t, "churn-ca")
	return f
}

// pair is a proxy-server with its frontend on a Unix socket, and a
// proxy-agent connected to it.
type pair struct {
	socket        string
	server, agent *proctest.Process
	// serverMetrics is the server's /metrics.
	serverMetrics string
	// agentPort, agentBin and certs start more agents (addAgent).
	agentPort int
	agentBin  string
	certs     pkitest.Files
}

// startPair starts a proxy-server in mode with its frontend on a Unix
// socket, and a proxy-agent connected to it over mTLS, and waits until
// both are ready. Both are killed when t ends.
func startPair(t *testing.T, serverBin, agentBin, mode string, c pkitest.Files) pair {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "proxy.sock")
	ports := nettest.FreePorts(t, 3)
	port := func(i int) string { return strconv.Itoa(ports[i]) }
	// -v=0: upstream's default verbosity logs every packet.
	flags := proctest.ServerFlags{Mode: mode, ID: "churn", Socket: socket, AgentPort: ports[0], HealthPort: ports[1], AdminPort: ports[2],
		Cert: c.ServerCert, Key: c.ServerKey, CA: c.CA}
	server := proctest.Start(t, serverBin, flags.Args("-v=0")...)
	if url := "http://127.0.0.1:" + port(1) + "/healthz"; !waitOK(t.Context(), url, 30*time.Second, server) {
		t.Fatalf("%s not ready within 30s, or the process exited\nproxy-server:\n%s", url, server.Output())
	}
	p := pair{socket: socket, server: server, serverMetrics: "http://127.0.0.1:" + port(1) + "/metrics", agentPort: ports[0], agentBin: agentBin, certs: c}
	p.agent = p.addAgent(t, "churn")
	return p
}

// addAgent starts a proxy-agent with ID id, connected to p's server, and
// waits until it is ready (holds the server). It is killed when t ends.
func (p pair) addAgent(t *testing.T, id string) *proctest.Process {
	t.Helper()
	ports := nettest.FreePorts(t, 2)
	c := p.certs
	flags := proctest.AgentFlags{ID: id, ServerPort: p.agentPort, CA: c.CA, Cert: c.AgentCert, Key: c.AgentKey, HealthPort: ports[0], AdminPort: ports[1]}
	agent := proctest.Start(t, p.agentBin, flags.Args("-v=0")...)
	if url := "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/readyz"; !waitOK(t.Context(), url, 30*time.Second, p.server, agent) {
		t.Fatalf("%s not ready within 30s, or a process exited\nproxy-server:\n%s\nproxy-agent:\n%s", url, p.server.Output(), agent.Output())
	}
	return agent
}

// waitOK polls url until it answers 200, for at most d, or until one of
// procs has exited.
func waitOK(ctx context.Context, url string, d time.Duration, procs ...*proctest.Process) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil); err == nil {
			if rsp, err := client.Do(req); err == nil {
				_ = rsp.Body.Close()
				if rsp.StatusCode == http.StatusOK {
					return true
				}
			}
		}
		for _, p := range procs {
			if exited, _ := p.Exited(); exited {
				return false
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}
