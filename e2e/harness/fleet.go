package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
)

// OurBinaries are proxy-server, proxy-agent and the servercount probe,
// built from this repository.
type OurBinaries struct {
	Server, Agent, Probe string
}

// BuildOurBinaries builds our three commands into dir with `go build`.
func BuildOurBinaries(ctx context.Context, dir string) (OurBinaries, error) {
	b := OurBinaries{
		Server: filepath.Join(dir, "proxy-server"),
		Agent:  filepath.Join(dir, "proxy-agent"),
		Probe:  filepath.Join(dir, "servercount"),
	}
	for out, pkg := range map[string]string{b.Server: "proxy-server", b.Agent: "proxy-agent", b.Probe: "servercount"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/servercount/servercount/cmd/"+pkg)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return OurBinaries{}, fmt.Errorf("go build %s: %w\n%s", pkg, err, msg)
		}
	}
	return b, nil
}

// Fleet runs proxy-servers on 127.0.0.x addresses, all with the same
// ports, and agents on 127.0.0.1, with TLS from one CA.
type Fleet struct {
	// Bin are the binaries.
	Bin OurBinaries
	// Dir holds certificates and logs.
	Dir string
	// CA signs every certificate.
	CA *pkitest.CA
	// CAFile, ServerCert, ServerKey, AgentCert and AgentKey are PEM files;
	// the server certificate is for "localhost", the name agents and
	// frontends check.
	CAFile, ServerCert, ServerKey, AgentCert, AgentKey string
	// FrontendClient is the client certificate of the frontend
	// (kube-apiserver's role); FrontendCert and FrontendKey are its PEM
	// files, for kube-apiserver's egress selector configuration.
	FrontendClient            tls.Certificate
	FrontendCert, FrontendKey string
	// FrontendPort, AgentPort, HealthPort and AdminPort are each server's
	// ports, on its own address.
	FrontendPort, AgentPort, HealthPort, AdminPort int
}

// NewFleet writes certificates into dir and picks the servers' ports.
func NewFleet(bin OurBinaries, dir string) (*Fleet, error) {
	f := &Fleet{Bin: bin, Dir: dir}
	var err error
	if f.CA, err = pkitest.NewCA("servercount-e2e-ca"); err != nil {
		return nil, err
	}
	if f.CAFile, err = f.CA.WriteFile(dir, "ca"); err != nil {
		return nil, err
	}
	srv, err := f.CA.Server("proxy-server")
	if err != nil {
		return nil, err
	}
	if f.ServerCert, f.ServerKey, err = srv.WriteFiles(dir, "server"); err != nil {
		return nil, err
	}
	agent, err := f.CA.Client("proxy-agent")
	if err != nil {
		return nil, err
	}
	if f.AgentCert, f.AgentKey, err = agent.WriteFiles(dir, "agent"); err != nil {
		return nil, err
	}
	client, err := f.CA.Client("kube-apiserver")
	if err != nil {
		return nil, err
	}
	f.FrontendClient = client.TLS
	if f.FrontendCert, f.FrontendKey, err = client.WriteFiles(dir, "frontend"); err != nil {
		return nil, err
	}
	ports, err := nettest.FreePortsOn("127.0.0.1", 4)
	if err != nil {
		return nil, err
	}
	f.FrontendPort, f.AgentPort, f.HealthPort, f.AdminPort = ports[0], ports[1], ports[2], ports[3]
	return f, nil
}

// Server is a proxy-server process on its own loopback address.
type Server struct {
	// IP is the server's address; every port listens there.
	IP string
	// Proc is the process.
	Proc  *Process
	fleet *Fleet
}

// StartServer starts a proxy-server in http-connect mode on ip and waits
// for its /healthz. t's cleanup stops it.
func (f *Fleet) StartServer(t testing.TB, ip string, extra ...string) *Server {
	t.Helper()
	name := "proxy-server-" + ip
	flags := proctest.ServerFlags{Mode: "http-connect", ID: name, Host: ip,
		FrontendPort: f.FrontendPort, AgentPort: f.AgentPort, HealthPort: f.HealthPort, AdminPort: f.AdminPort,
		Cert: f.ServerCert, Key: f.ServerKey, CA: f.CAFile}
	args := flags.Args(append([]string{"--server-count=1", "--graceful-shutdown-timeout=1s", "--v=2"}, extra...)...)
	p, err := proctest.StartProcess(name, filepath.Join(f.Dir, name+".log"), f.Bin.Server, args...)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{IP: ip, Proc: p, fleet: f}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.Log(3000))
		}
	})
	health := fmt.Sprintf("http://%s/healthz", net.JoinHostPort(ip, strconv.Itoa(f.HealthPort)))
	if err := waitFor(p, 20*time.Second, "healthy", getOK(health, "", nil)); err != nil {
		t.Fatal(err)
	}
	return s
}

// AgentAddr is the address agents dial on this server.
func (s *Server) AgentAddr() string { return net.JoinHostPort(s.IP, strconv.Itoa(s.fleet.AgentPort)) }

// Stop stops the server (SIGTERM, then SIGKILL).
func (s *Server) Stop() { s.Proc.Stop() }

// Metrics reads the server's /metrics.
func (s *Server) Metrics() (Metrics, error) {
	return Scrape(fmt.Sprintf("http://%s/metrics", net.JoinHostPort(s.IP, strconv.Itoa(s.fleet.HealthPort))))
}

// Get sends GET url through the server's frontend, as kube-apiserver would:
// HTTP CONNECT to url's host over mTLS, then the request; it returns the
// body.
func (s *Server) Get(url string) (string, error) {
	host := strings.TrimPrefix(url, "http://")
	if i := strings.IndexByte(host, '/'); i >= 0 {
		host = host[:i]
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: &tls.Config{
		RootCAs: s.fleet.CA.Pool(), Certificates: []tls.Certificate{s.fleet.FrontendClient}, ServerName: "localhost",
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(s.IP, strconv.Itoa(s.fleet.FrontendPort)))
	if err != nil {
		return "", fmt.Errorf("dial the frontend of %s: %w", s.IP, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", fmt.Errorf("CONNECT %s through %s: %w", host, s.IP, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("CONNECT %s through %s: %s", host, s.IP, resp.Status)
	}
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", url, host)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		return "", fmt.Errorf("GET %s through %s: %w", url, s.IP, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// AgentConfig configures an agent.
type AgentConfig struct {
	// Name names the agent in logs; it is also its --agent-id.
	Name string
	// DNSName is --server-count-dns; empty counts no servers through DNS.
	DNSName string
	// DNSServer is --server-count-dns-server.
	DNSServer string
	// DialMode is lb or resolved; empty means the default, lb.
	DialMode string
	// ServerAddr is the host:port to dial in lb mode (a load balancer);
	// empty means localhost and the fleet's agent port.
	ServerAddr string
	// Extra are more flags, after the defaults (a later flag wins, but
	// the DNS and dial mode flags come after them).
	Extra []string
	// Upstream says that Fleet.Bin.Agent is upstream's agent: the flags
	// only ours has are left out of the defaults.
	Upstream bool
	// CacheDefaults keeps the binary's DNS cache (the answers' TTL within
	// 1 s and 30 s, the back-off after failures from 1 s) where the suite
	// otherwise refreshes every 500 ms to follow its changes fast.
	CacheDefaults bool
}

// Agent is a proxy-agent process on 127.0.0.1.
type Agent struct {
	// Name names the agent.
	Name string
	// Proc is the process.
	Proc *Process
	// HealthURL is http://127.0.0.1:<health port>.
	HealthURL string
}

// StartAgent starts a proxy-agent with short sync and cache settings and
// waits for its /healthz. t's cleanup stops it.
func (f *Fleet) StartAgent(t testing.TB, cfg AgentConfig) *Agent {
	t.Helper()
	ports, err := nettest.FreePortsOn("127.0.0.1", 2)
	if err != nil {
		t.Fatal(err)
	}
	port := f.AgentPort
	if cfg.ServerAddr != "" {
		_, p, err := net.SplitHostPort(cfg.ServerAddr)
		if err == nil {
			port, err = strconv.Atoi(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	flags := proctest.AgentFlags{ID: cfg.Name, ServerPort: port, CA: f.CAFile, Cert: f.AgentCert, Key: f.AgentKey,
		HealthPort: ports[0], AdminPort: ports[1]}
	args := flags.Args("--sync-interval=200ms", "--sync-interval-cap=1s", "--v=2")
	if !cfg.Upstream {
		args = append(args, "--server-count-hold-down=2s")
	}
	args = append(args, cfg.Extra...)
	if cfg.DNSName != "" {
		args = append(args, "--server-count-dns="+cfg.DNSName, "--server-count-dns-server="+cfg.DNSServer)
		if !cfg.CacheDefaults {
			args = append(args, "--server-count-cache-ttl=500ms", "--server-count-cache-ttl-min=200ms")
		}
	}
	if cfg.DialMode != "" {
		args = append(args, "--server-dial-mode="+cfg.DialMode)
	}
	p, err := proctest.StartProcess(cfg.Name, filepath.Join(f.Dir, cfg.Name+".log"), f.Bin.Agent, args...)
	if err != nil {
		t.Fatal(err)
	}
	p.TermSignals = 2
	a := &Agent{Name: cfg.Name, Proc: p, HealthURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0])}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s log:\n%s", cfg.Name, p.Log(3000))
		}
	})
	if err := waitFor(p, 20*time.Second, "healthy", getOK(a.HealthURL+"/healthz", "", nil)); err != nil {
		t.Fatal(err)
	}
	return a
}

// Metrics reads the agent's /metrics.
func (a *Agent) Metrics() (Metrics, error) { return Scrape(a.HealthURL + "/metrics") }

// Connections is konnectivity_network_proxy_agent_open_server_connections,
// or -1 if the metrics could not be read.
func (a *Agent) Connections() int {
	m, err := a.Metrics()
	if err != nil {
		return -1
	}
	return int(m.Sum("konnectivity_network_proxy_agent_open_server_connections"))
}

// Target is servercount_agent_target_server_count of source, or -1 if the
// metrics could not be read.
func (a *Agent) Target(source string) int {
	m, err := a.Metrics()
	if err != nil {
		return -1
	}
	return int(m.Sum("servercount_agent_target_server_count", "source", source))
}

// ProbeResult is what one run of the servercount probe printed.
type ProbeResult struct {
	// Output is stdout and stderr.
	Output string
	// Exit is the exit status.
	Exit int
}

// Probe runs `servercount @server args...` with a bounded time.
func (f *Fleet) Probe(server string, args ...string) (ProbeResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.Bin.Probe, append([]string{"@" + server}, args...)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return ProbeResult{Output: string(out)}, fmt.Errorf("run the probe: %w", err)
	}
	return ProbeResult{Output: string(out), Exit: cmd.ProcessState.ExitCode()}, nil
}

// Metrics are the samples of a Prometheus text exposition: Sum(name,
// labels...) adds the series of name that have those labels.
type Metrics = proctest.Metrics

// Scrape reads the Prometheus text exposition at url, within 3 s.
func Scrape(url string) (Metrics, error) {
	cl := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return proctest.Parse(resp.Body)
}

// WriteFile writes data to name under dir, for results a test records.
func WriteFile(dir, name, data string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644)
}
