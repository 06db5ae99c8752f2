package tunnelbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
)

// Bounds on the fixture: every wait in this package ends.
const (
	// buildTimeout bounds building the binaries (a cold build cache
	// compiles client-go).
	buildTimeout = 10 * time.Minute
	// readyTimeout bounds the wait for a server and its agent to be ready.
	readyTimeout = 30 * time.Second
	// opTimeout bounds one dial and transfer, 100 MiB included.
	opTimeout = 2 * time.Minute
)

// Paths the target serves.
const (
	bulkPath = "/bulk" // bulkSize bytes
	tinyPath = "/tiny" // a few bytes
)

// bulkSize is the size of a throughput download.
const bulkSize = 100 << 20

// The binaries' packages, built once per run.
const (
	serverPkg = "github.com/servercount/servercount/cmd/proxy-server"
	agentPkg  = "github.com/servercount/servercount/cmd/proxy-agent"
)

// dialFunc opens a connection to addr, directly or through a tunnel.
type dialFunc func(ctx context.Context, addr string) (net.Conn, error)

// fixture is what every benchmark of the package runs against: an HTTP
// target, and a proxy-server with its proxy-agent for each frontend mode.
type fixture struct {
	target    string  // the HTTP target's host:port
	pairs     []*pair // ours, one per frontend mode: http-connect, then grpc
	upstream  []*pair // upstream's, the same way, for BenchmarkUpstream
	certs     certs
	profiling bool
	// ourAgentArgs are more flags for our proxy-agent.
	ourAgentArgs []string
	// echo is a connection to the echo peer process, for BenchmarkUpstream's
	// crossings.
	echo net.Conn
}

// pair is a proxy-server process and the proxy-agent process connected to
// it.
type pair struct {
	impl   string // whose binaries: ours or upstream
	mode   string // the server's --mode: http-connect or grpc
	name   string // mode's short name, for metric units: connect or grpc
	socket string // the server's frontend Unix socket
	// serverAdmin and agentAdmin are the base URLs of the admin ports,
	// which serve /debug/pprof with --enable-profiling.
	serverAdmin, agentAdmin string
	// serverPID and agentPID are the processes' IDs, to read the CPU time
	// they use.
	serverPID, agentPID int
}

// startFixture builds the binaries and starts the target and both pairs.
// Everything is stopped, and every file removed, when b ends.
func startFixture(b *testing.B, profiling bool, ourAgentArgs ...string) *fixture {
	b.Helper()
	serverBin, agentBin := build(b)
	f := &fixture{target: startTarget(b), certs: writeCerts(b), profiling: profiling, ourAgentArgs: ourAgentArgs}
	f.pairs = f.startPairs(b, "ours", serverBin, agentBin)
	return f
}

// certs are the PEM files every pair uses: one CA, a server certificate
// for localhost, an agent's client certificate.
type certs struct {
	ca, serverCert, serverKey, agentCert, agentKey string
}

func writeCerts(b *testing.B) certs {
	b.Helper()
	dir := b.TempDir()
	ca, err := pkitest.NewCA("tunnelbench-ca")
	if err != nil {
		b.Fatal(err)
	}
	files, err := ca.WriteFiles(dir)
	if err != nil {
		b.Fatal(err)
	}
	return certs{ca: files.CA, serverCert: files.ServerCert, serverKey: files.ServerKey, agentCert: files.AgentCert, agentKey: files.AgentKey}
}

// startPairs starts a proxy-server and its agent from serverBin and
// agentBin in each frontend mode, with the same flags whoever built them
// (impl names them: ours or upstream).
func (f *fixture) startPairs(b *testing.B, impl, serverBin, agentBin string) []*pair {
	b.Helper()
	dir := b.TempDir()
	var pairs []*pair
	for _, mode := range []struct{ mode, name string }{{"http-connect", "connect"}, {"grpc", "grpc"}} {
		ports := nettest.FreePorts(b, 5)
		p := &pair{
			impl:        impl,
			mode:        mode.mode,
			name:        mode.name,
			socket:      filepath.Join(dir, mode.name+".sock"),
			serverAdmin: fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
			agentAdmin:  fmt.Sprintf("http://127.0.0.1:%d", ports[4]),
		}
		id := "tunnelbench-" + impl + "-" + mode.name
		serverArgs := proctest.ServerFlags{Mode: mode.mode, ID: id, Socket: p.socket, AgentPort: ports[0], HealthPort: ports[1], AdminPort: ports[2],
			Cert: f.certs.serverCert, Key: f.certs.serverKey, CA: f.certs.ca}.Args()
		agentArgs := proctest.AgentFlags{ID: id, ServerPort: ports[0], CA: f.certs.ca, Cert: f.certs.agentCert, Key: f.certs.agentKey,
			HealthPort: ports[3], AdminPort: ports[4]}.Args()
		if f.profiling {
			serverArgs = append(serverArgs, "--enable-profiling")
			agentArgs = append(agentArgs, "--enable-profiling")
		}
		if impl == "ours" {
			serverArgs = append(serverArgs, strings.Fields(*extraArgs)...)
			agentArgs = append(agentArgs, strings.Fields(*extraArgs)...)
			agentArgs = append(agentArgs, f.ourAgentArgs...)
		}
		// proctest.Start kills and waits for each process in b.Cleanup.
		server := proctest.Start(b, serverBin, serverArgs...)
		agent := proctest.Start(b, agentBin, agentArgs...)
		serverReady := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])
		agentReady := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[3])
		if err := waitReady(b.Context(), serverReady, agentReady); err != nil {
			b.Fatalf("%s %s: %v\nproxy-server output:\n%s\nproxy-agent output:\n%s", impl, mode.mode, err, server.Output(), agent.Output())
		}
		p.serverPID, p.agentPID = server.Process.Pid, agent.Process.Pid
		pairs = append(pairs, p)
	}
	return pairs
}

// build compiles the proxy-server and proxy-agent into a temporary
// directory, or skips b if there is no go command.
func build(b *testing.B) (serverBin, agentBin string) {
	b.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		b.Skipf("tunnelbench runs the proxy-server and proxy-agent binaries, and builds them with the go command, which is not on PATH: %v", err)
	}
	dir := b.TempDir()
	ctx, cancel := context.WithTimeout(b.Context(), buildTimeout)
	defer cancel()
	// A trailing separator makes -o a directory for several packages.
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", dir+string(os.PathSeparator), serverPkg, agentPkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build %s %s: %v\n%s", serverPkg, agentPkg, err, out)
	}
	return filepath.Join(dir, "proxy-server"), filepath.Join(dir, "proxy-agent")
}

// startTarget starts the HTTP server that tunnels reach, on loopback, and
// returns its host:port. It serves bulkPath from memory, so that the
// target's disk plays no part.
func startTarget(b *testing.B) string {
	b.Helper()
	bulk := make([]byte, bulkSize)
	_, _ = rand.Read(bulk) // incompressible, should a path ever compress
	mux := http.NewServeMux()
	mux.HandleFunc(bulkPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(bulk)))
		_, _ = w.Write(bulk) // the client reports a short body
	})
	mux.HandleFunc(tinyPath, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := httptest.NewServer(mux) // listens on 127.0.0.1
	b.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// waitReady polls each URL until it answers 200, within readyTimeout. The
// proxy-server's /readyz answers 200 once an agent is connected, the
// proxy-agent's once it holds a server connection.
func waitReady(ctx context.Context, urls ...string) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	// No keep-alives: an idle connection would outlive the benchmark.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, url := range urls {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			rsp, err := client.Do(req)
			if err == nil {
				_ = rsp.Body.Close()
				if rsp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s not ready within %v (last error %v): %w", url, readyTimeout, err, ctx.Err())
			case <-tick.C:
			}
		}
	}
	return nil
}

// dialDirect opens a TCP connection to addr.
func dialDirect(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// dial returns p's way to open a tunnel, the one kube-apiserver takes to
// the server's frontend on a Unix socket in p's mode. A tunnel lasts as
// long as the context it was dialled with.
func (p *pair) dial() dialFunc {
	return dialFunc(churn.OverUnix(p.mode, p.socket))
}

// fetch sends a GET of path on c and reads the whole response into buf,
// chunk by chunk. It returns when the first byte of the response arrived,
// and the body's length. It closes c when ctx ends: a tunnel connection
// has no deadlines.
func fetch(ctx context.Context, c net.Conn, path string, buf []byte) (first time.Time, n int64, err error) {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n", path); err != nil {
		return first, 0, fmt.Errorf("send GET %s: %w", path, err)
	}
	// Reads of len(buf) bypass the small buffer once the headers are read.
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err != nil {
		return first, 0, fmt.Errorf("wait for the answer to GET %s: %w", path, err)
	}
	first = time.Now()
	rsp, err := http.ReadResponse(br, nil)
	if err != nil {
		return first, 0, fmt.Errorf("read the answer to GET %s: %w", path, err)
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		return first, 0, fmt.Errorf("GET %s: %s", path, rsp.Status)
	}
	for {
		k, err := rsp.Body.Read(buf)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return first, n, fmt.Errorf("read the body of GET %s after %d bytes: %w", path, n, err)
		}
	}
	if n != rsp.ContentLength {
		return first, n, fmt.Errorf("GET %s: %d bytes of %d", path, n, rsp.ContentLength)
	}
	return first, n, nil
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat: Linux reports
// them in USER_HZ ticks, which is 100 on every architecture Go supports.
const userHZ = 100

// cpuTime returns the CPU time, user and system, that process pid and all
// its threads have used so far. It is Linux only.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read the CPU time of process %d: %w", pid, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields to count start after its closing one, with field 3.
	i := bytes.LastIndexByte(b, ')')
	var fields []string
	if i >= 0 {
		fields = strings.Fields(string(b[i+1:]))
	}
	if len(fields) < 13 {
		return 0, fmt.Errorf("read the CPU time of process %d: unexpected /proc/%d/stat: %q", pid, pid, b)
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime and stime, fields 14 and 15
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read the CPU time of process %d: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
