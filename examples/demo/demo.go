package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/servercount/servercount/cmd/proxy-agent/app"
	agentoptions "github.com/servercount/servercount/cmd/proxy-agent/app/options"
	serverapp "github.com/servercount/servercount/cmd/proxy-server/app"
	serveroptions "github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
)

// svc is the headless Service the agent counts.
const svc = "proxy-server.kube-system.svc.cluster.local."

// waitFor bounds each wait for the agent to catch up.
const waitFor = 20 * time.Second

// demo holds what the demo started.
type demo struct {
	out     io.Writer
	dir     string // certificates
	dns     *dnstest.Server
	target  string // the HTTP target's host:port
	ports   ports
	servers map[string]*runningServer // by IP
	// agentHealth is the agent's health URL, once it runs.
	agentHealth string
	client      tls.Certificate
	ca          *pkitest.CA
}

// ports are shared by every server, each on its own loopback IP, as pods
// of one Deployment share their ports.
type ports struct{ agent, frontend, health, admin int }

type runningServer struct {
	ip   string
	stop context.CancelFunc
	done chan error
}

// run runs the demo, writing its story to out and, with chartPath, a
// PNG chart of the agent's counts over time.
func run(ctx context.Context, out io.Writer, chartPath string) (err error) {
	d := &demo{out: out, servers: map[string]*runningServer{}}
	tl := &timeline{start: time.Now()}
	if d.dir, err = os.MkdirTemp("", "servercount-demo-"); err != nil {
		return err
	}
	defer os.RemoveAll(d.dir)
	if err := d.writeCerts(); err != nil {
		return err
	}
	if d.dns, err = dnstest.Start(); err != nil {
		return err
	}
	defer d.dns.Close()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello from the cluster") }))
	defer target.Close()
	d.target = strings.TrimPrefix(target.URL, "http://")
	if d.ports, err = freePorts(8); err != nil {
		return err
	}
	defer d.stopAll()

	d.say("DNS server on %s serves %s (one A record per ready server); HTTP target on %s\n", d.dns.Addr(), svc, d.target)

	// 3 servers.
	if err := d.scale(ctx, 3); err != nil {
		return err
	}
	agentHealth, stopAgent, err := d.startAgent(ctx)
	if err != nil {
		return err
	}
	defer stopAgent()
	d.agentHealth = agentHealth
	stopSampling := tl.sample(ctx, agentHealth+"/metrics", 25*time.Millisecond)
	defer stopSampling()
	tl.mark("agent starts")
	if err := d.step(ctx, "3 proxy-servers, one agent", agentHealth, 3); err != nil {
		return err
	}
	tl.mark("scale to 5")
	if err := d.scale(ctx, 5); err != nil {
		return err
	}
	if err := d.step(ctx, "scaled up to 5: DNS lists 5 addresses", agentHealth, 5); err != nil {
		return err
	}
	tl.mark("scale to 2")
	if err := d.scale(ctx, 2); err != nil {
		return err
	}
	if err := d.step(ctx, "scaled down to 2: DNS lists 2, three servers stopped (the target drops after the 2s hold-down)", agentHealth, 2); err != nil {
		return err
	}
	stopSampling()
	if chartPath != "" {
		if err := tl.write(chartPath); err != nil {
			return err
		}
		d.say("chart of the counts over time: %s\n", chartPath)
	}
	d.say("done: every server, the agent and the DNS server are stopped\n")
	return nil
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func ip(i int) string { return fmt.Sprintf("127.0.0.%d", i+2) }

// scale starts or stops servers so that n run, on 127.0.0.2 and up, and
// points DNS at them: new servers are started before DNS lists them, and
// removed from DNS before they stop, as Kubernetes readiness does.
func (d *demo) scale(ctx context.Context, n int) error {
	var ips []string
	for i := range n {
		ips = append(ips, ip(i))
		if d.servers[ip(i)] == nil {
			if err := d.startServer(ctx, ip(i)); err != nil {
				return err
			}
		}
	}
	d.dns.SetRecords(dnstest.Headless(svc, "agent", "tcp", uint16(d.ports.agent), ips...)...)
	// A server leaves DNS before it stops, as a terminating pod leaves its
	// Service's endpoints first: wait until the agent's DNS count shows it.
	if d.agentHealth != "" && len(d.servers) > n {
		err := waitUntil(ctx, func() bool {
			return scrape(d.agentHealth+"/metrics").dnsCount == n
		}, fmt.Sprintf("the agent's DNS count to show %d servers", n))
		if err != nil {
			return err
		}
	}
	for addr, s := range d.servers {
		if !slices.Contains(ips, addr) {
			s.stop()
			<-s.done
			delete(d.servers, addr)
		}
	}
	return nil
}

func (d *demo) startServer(ctx context.Context, ip string) error {
	o := serveroptions.NewOptions()
	flags := proctest.ServerFlags{Mode: "http-connect", ID: "server-" + ip, Host: ip,
		FrontendPort: d.ports.frontend, AgentPort: d.ports.agent, HealthPort: d.ports.health, AdminPort: d.ports.admin,
		Cert: d.file("server.crt"), Key: d.file("server.key"), CA: d.file("ca.crt")}
	// The servers count themselves through DNS too, so that upstream
	// agents would also learn the right count from their headers.
	args := flags.Args("--server-count-dns="+svc, "--server-count-dns-server="+d.dns.Addr(),
		"--server-count-cache-ttl=200ms", "--server-count-cache-ttl-min=100ms")
	if err := o.Flags().Parse(args); err != nil {
		return err
	}
	if errs := o.Validate(); len(errs) > 0 {
		return errors.Join(errs...)
	}
	sctx, stop := context.WithCancel(ctx)
	s := &runningServer{ip: ip, stop: stop, done: make(chan error, 1)}
	go func() { s.done <- serverapp.Run(sctx, o.Config()) }()
	d.servers[ip] = s
	// Ready to accept agents once its health port answers.
	return waitUntil(ctx, func() bool {
		return httpStatus(fmt.Sprintf("http://%s:%d/healthz", ip, d.ports.health)) == http.StatusOK
	}, "server "+ip+" to listen")
}

func (d *demo) startAgent(ctx context.Context) (health string, stop func(), err error) {
	o := agentoptions.NewOptions()
	counting := []string{
		"--server-count-dns=" + svc, "--server-count-dns-server=" + d.dns.Addr(), "--server-dial-mode=resolved",
		"--server-count-cache-ttl=200ms", "--server-count-cache-ttl-min=100ms",
		"--server-count-hold-down=2s", "--sync-interval=200ms",
	}
	flags := proctest.AgentFlags{ID: "demo-agent", ServerPort: d.ports.agent,
		CA: d.file("ca.crt"), Cert: d.file("agent.crt"), Key: d.file("agent.key"),
		HealthPort: d.ports.health, AdminPort: d.ports.admin}
	args := flags.Args(counting...)
	if err := o.Flags().Parse(args); err != nil {
		return "", nil, err
	}
	if errs := o.Validate(); len(errs) > 0 {
		return "", nil, errors.Join(errs...)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.Run(actx, context.Background(), o.Config()) }()
	d.say("proxy-agent %s\n\n", strings.Join(counting, " "))
	return fmt.Sprintf("http://127.0.0.1:%d", d.ports.health), func() { cancel(); <-done }, nil
}

// step waits until the agent holds want servers and aims for want, then
// prints what it counts, holds and spent, and a request through each
// server.
func (d *demo) step(ctx context.Context, title string, agentHealth string, want int) error {
	d.say("=== %s\n", title)
	start := time.Now()
	var m agentMetrics
	err := waitUntil(ctx, func() bool {
		m = scrape(agentHealth + "/metrics")
		// A scrape is no snapshot: the dials counter can be read before a
		// dial that the connections gauge, read later, already shows.
		// Wait for both, so that the line printed adds up.
		return m.connections == want && m.target == want && m.dialsOK+m.dialsDup+m.dialsErr >= want
	}, fmt.Sprintf("the agent to hold %d servers", want))
	if err != nil {
		return err
	}
	d.say("agent: counts %d servers (source %s), holds %d connections, %d dials so far (%d duplicates, %d failed); caught up in %s\n",
		m.target, m.source, m.connections, m.dialsOK+m.dialsDup+m.dialsErr, m.dialsDup, m.dialsErr, time.Since(start).Round(10*time.Millisecond))
	for i := range want {
		body, err := d.request(ctx, ip(i))
		if err != nil {
			return fmt.Errorf("request through server %s: %w", ip(i), err)
		}
		d.say("  GET http://%s/ via proxy-server %s -> %q\n", d.target, ip(i), body)
	}
	d.say("\n")
	return nil
}

// request sends a GET to the target through one server's HTTP CONNECT
// frontend, as kube-apiserver's egress does.
func (d *demo) request(ctx context.Context, ip string) (string, error) {
	dialer := &tls.Dialer{Config: &tls.Config{RootCAs: d.ca.Pool(), Certificates: []tls.Certificate{d.client}, ServerName: "localhost"}}
	c, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(d.ports.frontend)))
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", d.target, d.target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("CONNECT: %s", resp.Status)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", d.target)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (d *demo) stopAll() {
	for ip, s := range d.servers {
		s.stop()
		<-s.done
		delete(d.servers, ip)
	}
}

func (d *demo) file(name string) string { return filepath.Join(d.dir, name) }

func (d *demo) writeCerts() error {
	ca, err := pkitest.NewCA("servercount-demo-ca")
	if err != nil {
		return err
	}
	d.ca = ca
	if _, err := ca.WriteFile(d.dir, "ca"); err != nil {
		return err
	}
	srv, err := ca.Server("proxy-server")
	if err != nil {
		return err
	}
	if _, _, err := srv.WriteFiles(d.dir, "server"); err != nil {
		return err
	}
	ag, err := ca.Client("proxy-agent")
	if err != nil {
		return err
	}
	if _, _, err := ag.WriteFiles(d.dir, "agent"); err != nil {
		return err
	}
	cl, err := ca.Client("kube-apiserver")
	if err != nil {
		return err
	}
	d.client = cl.TLS
	return nil
}

// agentMetrics are the agent's metrics the demo prints.
type agentMetrics struct {
	target, connections, dnsCount int
	source                        string
	dialsOK, dialsDup, dialsErr   int
}

func scrape(url string) agentMetrics {
	var m agentMetrics
	s, err := proctest.Scrape(url)
	if err != nil {
		return m
	}
	if t := s["servercount_agent_target_server_count"]; len(t) > 0 {
		m.source, m.target = t[0].Labels["source"], int(t[0].Value)
	}
	m.connections = int(s.Sum("konnectivity_network_proxy_agent_open_server_connections"))
	m.dnsCount = int(s.Sum("servercount_agent_dns_server_count"))
	m.dialsOK = int(s.Sum("servercount_agent_server_dials_total", "result", "ok"))
	m.dialsDup = int(s.Sum("servercount_agent_server_dials_total", "result", "duplicate"))
	m.dialsErr = int(s.Sum("servercount_agent_server_dials_total", "result", "error"))
	return m
}

func httpStatus(url string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitUntil polls cond until it holds, ctx ends or waitFor passes.
func waitUntil(ctx context.Context, cond func() bool, what string) error {
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
	return nil
}

// freePorts finds ports free on every address the demo uses: each server
// listens on its own loopback address, the agent's side on 127.0.0.1,
// all on the same port numbers.
func freePorts(servers int) (ports, error) {
	for try := 0; try < 20; try++ {
		got, err := nettest.FreePortsOn("127.0.0.2", 4)
		if err != nil {
			return ports{}, fmt.Errorf("the demo needs loopback addresses 127.0.0.2 and up: %w", err)
		}
		if freeOnAll(got, servers) {
			return ports{agent: got[0], frontend: got[1], health: got[2], admin: got[3]}, nil
		}
	}
	return ports{}, errors.New("found no ports free on every loopback address")
}

// freeOnAll reports whether every port of got was free a moment ago on
// 127.0.0.1 and on the address of each of servers.
func freeOnAll(got []int, servers int) bool {
	for _, p := range got {
		for s := range servers {
			for _, host := range []string{ip(s), "127.0.0.1"} {
				l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
				if err != nil {
					return false
				}
				_ = l.Close()
			}
		}
	}
	return true
}
