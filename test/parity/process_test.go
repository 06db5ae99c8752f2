package parity

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
)

// pkiFiles are a CA, for the tests' own clients, and its files for the
// processes.
type pkiFiles struct {
	ca *pkitest.CA
	pkitest.Files
}

func writePKI(t *testing.T) pkiFiles {
	t.Helper()
	ca, f := pkitest.TempFiles(t, "parity-ca")
	return pkiFiles{ca: ca, Files: f}
}

// server is a proxy-server process, its frontend on a Unix socket.
type server struct {
	*proctest.Process
	socket              string
	agentPort           int
	healthURL, adminURL string
}

// startServer starts bin in mode, with env added to its environment and
// args after the usual ones; it does not wait for it.
func startServer(t *testing.T, bin, mode string, p pkiFiles, env []string, args ...string) *server {
	t.Helper()
	ports := nettest.FreePorts(t, 3)
	s := &server{
		socket:    filepath.Join(t.TempDir(), "proxy.sock"),
		agentPort: ports[0],
		healthURL: "http://127.0.0.1:" + strconv.Itoa(ports[1]),
		adminURL:  "http://127.0.0.1:" + strconv.Itoa(ports[2]),
	}
	flags := proctest.ServerFlags{Mode: mode, Socket: s.socket, AgentPort: ports[0], HealthPort: ports[1], AdminPort: ports[2],
		Cert: p.ServerCert, Key: p.ServerKey, CA: p.CA}
	s.Process = startWithEnv(t, bin, env, flags.Args(append([]string{"-v=0"}, args...)...)...)
	return s
}

// agent is a proxy-agent process.
type agent struct {
	*proctest.Process
	healthURL string
}

// startAgent starts bin connected to the agent port agentPort, with env
// and args added; it does not wait for it.
func startAgent(t *testing.T, bin string, agentPort int, p pkiFiles, env []string, args ...string) *agent {
	t.Helper()
	ports := nettest.FreePorts(t, 2)
	a := &agent{healthURL: "http://127.0.0.1:" + strconv.Itoa(ports[0])}
	flags := proctest.AgentFlags{ServerPort: agentPort, CA: p.CA, Cert: p.AgentCert, Key: p.AgentKey, HealthPort: ports[0], AdminPort: ports[1]}
	a.Process = startWithEnv(t, bin, env, flags.Args(append([]string{"-v=0"}, args...)...)...)
	return a
}

// startWithEnv is proctest.Start with env added to the process's
// environment.
func startWithEnv(t *testing.T, bin string, env []string, args ...string) *proctest.Process {
	t.Helper()
	if len(env) == 0 {
		return proctest.Start(t, bin, args...)
	}
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1]) // the child inherits it; restored when t ends
	}
	return proctest.Start(t, bin, args...)
}

// waitStatus polls url until it answers want, within 30 s, and fails t
// if it does not, or if one of procs exits first.
func waitStatus(t *testing.T, url string, want int, procs ...*proctest.Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	last := 0
	for {
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil); err == nil {
			if rsp, err := client.Do(req); err == nil {
				_ = rsp.Body.Close()
				if last = rsp.StatusCode; last == want {
					return
				}
			}
		}
		for _, p := range procs {
			if exited, _ := p.Exited(); exited {
				t.Fatalf("%s exited while waiting for %s to answer %d:\n%s", p.Path, url, want, p.Output())
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s answered %d, not %d, within 30s", url, last, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// status returns the status of a GET of url, 0 if there is no answer.
func status(url string) int { return proctest.Status(url) }

// fileMode returns the permission bits of path.
func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Mode().Perm()
}
