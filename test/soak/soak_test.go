// Package soak runs the real proxy-server and proxy-agent binaries on
// loopback under thousands of tunnels from normal, slow, vanishing and
// hostile peers, then checks that every resource they held comes back:
// goroutines, file descriptors and the tunnel gauges return to their
// baseline, and memory stays within a bound.
//
// It runs only when SOAK_DURATION is set (make soak sets it).
package soak_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/internal/proxytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Bounds the soak checks at its end.
const (
	// slack is how many goroutines or fds above its baseline a process may
	// end with: idle keep-alive and metrics connections come and go.
	slack = 10
	// maxRSS bounds each process's resident memory at its peak.
	maxRSS = 256 << 20
	// settle bounds the wait for resources to come back after the load.
	settle = 60 * time.Second
	// workers is the number of concurrent peers per server.
	workers = 24
)

// pair is a proxy-server and a proxy-agent connected to it.
type pair struct {
	mode                      string
	server, agent             *proctest.Process
	frontend                  string // the server's frontend address
	serverHealth, agentHealth string
	tlsConfig                 *tls.Config // a frontend client's
}

func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SOAK_DURATION"))
	if err != nil || d <= 0 {
		t.Skip("SOAK_DURATION is not set: run make soak")
	}
	serverBin := proctest.Build(t, "cmd/proxy-server")
	agentBin := proctest.Build(t, "cmd/proxy-agent")
	dir := t.TempDir()
	ca, err := pkitest.NewCA("soak-ca")
	require.NoError(t, err)
	caFile, err := ca.WriteFile(dir, "ca")
	require.NoError(t, err)
	issue := func(name string, p *pkitest.Pair, err error) (string, string) {
		require.NoError(t, err)
		c, k, err := p.WriteFiles(dir, name)
		require.NoError(t, err)
		return c, k
	}
	sp, err := ca.Server("proxy-server")
	srvCert, srvKey := issue("server", sp, err)
	ap, err := ca.Client("proxy-agent")
	agentCert, agentKey := issue("agent", ap, err)
	client, err := ca.Client("kube-apiserver")
	require.NoError(t, err)
	frontendTLS := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client.TLS}, ServerName: "localhost"}

	start := func(mode string) *pair {
		ports := nettest.FreePorts(t, 6)
		p := &pair{
			mode:         mode,
			frontend:     fmt.Sprintf("127.0.0.1:%d", ports[0]),
			serverHealth: fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
			agentHealth:  fmt.Sprintf("http://127.0.0.1:%d", ports[4]),
			tlsConfig:    frontendTLS,
		}
		p.server = proctest.Start(t, serverBin, proctest.ServerFlags{Mode: mode,
			FrontendPort: ports[0], AgentPort: ports[1], HealthPort: ports[2], AdminPort: ports[3],
			Cert: srvCert, Key: srvKey, CA: caFile}.Args()...)
		p.agent = proctest.Start(t, agentBin, proctest.AgentFlags{ID: "soak-" + mode, ServerPort: ports[1],
			CA: caFile, Cert: agentCert, Key: agentKey, HealthPort: ports[4], AdminPort: ports[5]}.Args()...)
		return p
	}
	pairs := []*pair{start("http-connect"), start("grpc")}
	for _, p := range pairs {
		require.Eventually(t, func() bool {
			return proctest.Status(p.serverHealth+"/readyz") == http.StatusOK && proctest.Status(p.agentHealth+"/readyz") == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "%s server and agent ready", p.mode)
	}

	echo := nettest.StartTarget(t, proxytest.Echo)
	stop := make(chan struct{})
	// A target that never reads: its handler holds each connection until
	// the end of the test.
	blackhole := nettest.StartTarget(t, func(net.Conn) { <-stop })
	t.Cleanup(func() { close(stop) }) // runs before the targets' Close
	targets := targets{echo: echo.Addr(), blackhole: blackhole.Addr()}

	// Warm up, then take the baseline: the first tunnels start pools and
	// goroutines that stay.
	for _, p := range pairs {
		for range 20 {
			require.NoError(t, normal(t.Context(), p, targets), p.mode)
		}
	}
	base := map[string]usage{}
	for _, p := range pairs {
		waitIdle(t, p)
		base[p.mode+"/server"] = measure(t, p.serverHealth)
		base[p.mode+"/agent"] = measure(t, p.agentHealth)
	}

	peak := sampleRSS(t, pairs)
	stats := newStats()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range pairs {
		for w := range workers {
			wg.Go(func() {
				r := mrand.New(mrand.NewPCG(uint64(w), uint64(len(p.mode))))
				for ctx.Err() == nil {
					kind := pick(r)
					opCtx, opCancel := context.WithTimeout(context.Background(), 30*time.Second)
					began := time.Now()
					err := kind.run(opCtx, p, targets, r)
					opCancel()
					stats.add(p.mode, kind.name, time.Since(began), err)
				}
			})
		}
	}
	wg.Wait()
	rss := peak()

	for _, p := range pairs {
		waitIdle(t, p)
		for _, role := range []struct{ name, url string }{{"server", p.serverHealth}, {"agent", p.agentHealth}} {
			key := p.mode + "/" + role.name
			b := base[key]
			var u usage
			ok := assert.Eventually(t, func() bool {
				u = measure(t, role.url)
				return u.goroutines <= b.goroutines+slack && u.fds <= b.fds+slack
			}, settle, 100*time.Millisecond, "%s: goroutines and fds back to baseline", key)
			t.Logf("%-20s goroutines %4.0f -> %4.0f, fds %4.0f -> %4.0f, peak RSS %5.1f MiB", key, b.goroutines, u.goroutines, b.fds, u.fds, float64(rss[key])/(1<<20))
			if !ok {
				t.Logf("%s last figures: %+v", key, u)
			}
			assert.LessOrEqual(t, rss[key], uint64(maxRSS), "%s peak RSS", key)
			serverExited, _ := p.server.Exited()
			agentExited, _ := p.agent.Exited()
			assert.False(t, serverExited || agentExited, "%s: a process exited", p.mode)
		}
	}
	t.Log(stats.report(d))
	for _, mode := range []string{"http-connect", "grpc"} {
		s := stats.get(mode, "normal")
		assert.Zero(t, s.failed, "%s: normal tunnels failed beside hostile peers: %v", mode, s.firstErr)
		assert.Positive(t, s.ok, "%s: no normal tunnel ran", mode)
	}
}

// targets are the endpoints tunnels reach.
type targets struct{ echo, blackhole string }

// usage is what a process holds.
type usage struct{ goroutines, fds, rss float64 }

func measure(t *testing.T, health string) usage {
	m, err := proctest.Scrape(health + "/metrics")
	if err != nil {
		t.Logf("scrape %s: %v", health, err)
		return usage{goroutines: math.Inf(1), fds: math.Inf(1)}
	}
	g, _ := m.Value("go_goroutines")
	f, _ := m.Value("process_open_fds")
	r, _ := m.Value("process_resident_memory_bytes")
	return usage{goroutines: g, fds: f, rss: r}
}

// waitIdle waits until no tunnel is open on p's server or agent.
func waitIdle(t *testing.T, p *pair) {
	t.Helper()
	var last string
	ok := assert.Eventually(t, func() bool {
		sm, err1 := proctest.Scrape(p.serverHealth + "/metrics")
		am, err2 := proctest.Scrape(p.agentHealth + "/metrics")
		if err1 != nil || err2 != nil {
			return false
		}
		last = sm.String("konnectivity_network_proxy_server_") + am.String("konnectivity_network_proxy_agent_open_endpoint")
		return sm.Sum("konnectivity_network_proxy_server_established_connections") == 0 &&
			sm.Sum("konnectivity_network_proxy_server_pending_backend_dials") == 0 &&
			sm.Sum("konnectivity_network_proxy_server_http_connections") == 0 &&
			am.Sum("konnectivity_network_proxy_agent_open_endpoint_connections") == 0
	}, settle, 100*time.Millisecond, "%s: every tunnel closed", p.mode)
	if !ok {
		t.Logf("%s gauges:\n%s", p.mode, last)
	}
}

// sampleRSS records each process's peak resident memory until the
// returned function is called, which returns the peaks.
func sampleRSS(t *testing.T, pairs []*pair) func() map[string]uint64 {
	var mu sync.Mutex
	peaks := map[string]uint64{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, p := range pairs {
				for key, url := range map[string]string{p.mode + "/server": p.serverHealth, p.mode + "/agent": p.agentHealth} {
					u := measure(t, url)
					mu.Lock()
					if !math.IsInf(u.rss, 0) && uint64(u.rss) > peaks[key] {
						peaks[key] = uint64(u.rss)
					}
					mu.Unlock()
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() map[string]uint64 {
		close(done)
		wg.Wait()
		return peaks
	}
}

// peer is one kind of client behaviour.
type peer struct {
	name   string
	weight int
	run    func(ctx context.Context, p *pair, tg targets, r *mrand.Rand) error
}

var peers = []peer{
	{"normal", 50, func(ctx context.Context, p *pair, tg targets, _ *mrand.Rand) error { return normal(ctx, p, tg) }},
	{"slow", 10, slow},
	{"vanishing", 20, vanishing},
	{"hostile", 15, hostile},
	{"no-read-endpoint", 5, noReadEndpoint},
}

func pick(r *mrand.Rand) peer {
	total := 0
	for _, p := range peers {
		total += p.weight
	}
	n := r.IntN(total)
	for _, p := range peers {
		if n < p.weight {
			return p
		}
		n -= p.weight
	}
	return peers[0]
}

// dial opens a tunnel to addr through p's frontend, as kube-apiserver
// does in p's mode.
func dial(ctx context.Context, p *pair, addr string) (net.Conn, error) {
	if p.mode == "grpc" {
		tunnel, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), p.frontend,
			grpc.WithTransportCredentials(credentials.NewTLS(p.tlsConfig)))
		if err != nil {
			return nil, err
		}
		return tunnel.DialContext(ctx, "tcp", addr)
	}
	d := tls.Dialer{Config: p.tlsConfig}
	c, err := d.DialContext(ctx, "tcp", p.frontend)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("CONNECT %s: %s", addr, resp.Status)
	}
	return &bufConn{Conn: c, r: br}, nil
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// roundTrip writes n random bytes to c and reads them back.
func roundTrip(ctx context.Context, c net.Conn, n int, pause time.Duration) error {
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	data := make([]byte, n)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() { _, err := c.Write(data); werr <- err }()
	if pause > 0 {
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
	}
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo differs")
	}
	return nil
}

// normal: a tunnel, 4 KiB each way, closed.
func normal(ctx context.Context, p *pair, tg targets) error {
	c, err := dial(ctx, p, tg.echo)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(ctx, c, 4<<10, 0)
}

// slow: 1 MiB written while the client does not read for 200 ms.
func slow(ctx context.Context, p *pair, tg targets, _ *mrand.Rand) error {
	c, err := dial(ctx, p, tg.echo)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(ctx, c, 1<<20, 200*time.Millisecond)
}

// vanishing: a client that goes away during the dial or mid-transfer.
func vanishing(ctx context.Context, p *pair, tg targets, r *mrand.Rand) error {
	switch r.IntN(3) {
	case 0: // gone while the dial is in flight
		dctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(3000))*time.Microsecond)
		defer cancel()
		if c, err := dial(dctx, p, tg.echo); err == nil {
			c.Close()
		}
	case 1: // a CONNECT request, then gone before the answer
		if p.mode != "http-connect" {
			return nil
		}
		d := tls.Dialer{Config: p.tlsConfig}
		c, err := d.DialContext(ctx, "tcp", p.frontend)
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", tg.echo, tg.echo)
		// Gone at any point of the dial: before the server reads the
		// request, while the agent dials, or as the answer comes.
		time.Sleep(time.Duration(r.IntN(5000)) * time.Microsecond)
		c.Close()
	default: // gone mid-transfer, with data in flight
		c, err := dial(ctx, p, tg.echo)
		if err != nil {
			return err
		}
		_, _ = c.Write(make([]byte, 64<<10))
		c.Close()
	}
	return nil
}

// hostile: requests a server must refuse without holding anything.
func hostile(ctx context.Context, p *pair, tg targets, r *mrand.Rand) error {
	var d net.Dialer
	switch r.IntN(4) {
	case 0: // plain TCP garbage on the TLS frontend
		c, err := d.DialContext(ctx, "tcp", p.frontend)
		if err != nil {
			return err
		}
		_, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	case 1: // TLS without a client certificate
		c, err := tls.DialWithDialer(&d, "tcp", p.frontend, &tls.Config{RootCAs: p.tlsConfig.RootCAs, ServerName: "localhost"})
		if err == nil {
			_, _ = c.Write([]byte("CONNECT x:1 HTTP/1.1\r\n\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
	case 2: // invalid targets
		bad := []string{"/", "nohostport", ":80", strings.Repeat("a", 5000) + ":1", "127.0.0.1:1"}
		if c, err := dial(ctx, p, bad[r.IntN(len(bad))]); err == nil {
			c.Close()
		}
	default: // a huge header
		if p.mode != "http-connect" {
			return nil
		}
		c, err := (&tls.Dialer{Config: p.tlsConfig}).DialContext(ctx, "tcp", p.frontend)
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nX-Big: %s\r\n\r\n", tg.echo, strings.Repeat("b", 2<<20))
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	return nil
}

// noReadEndpoint: a tunnel to an endpoint that never reads, fed 256 KiB,
// then abandoned.
func noReadEndpoint(ctx context.Context, p *pair, tg targets, _ *mrand.Rand) error {
	c, err := dial(ctx, p, tg.blackhole)
	if err != nil {
		return err
	}
	_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	_, _ = c.Write(make([]byte, 256<<10))
	return c.Close()
}

// stats counts outcomes per mode and peer kind.
type stats struct {
	mu sync.Mutex
	m  map[string]*kindStats
	n  atomic.Int64
}

type kindStats struct {
	ok, failed int
	firstErr   error
	latencies  []time.Duration
}

func newStats() *stats { return &stats{m: map[string]*kindStats{}} }

func (s *stats) add(mode, kind string, d time.Duration, err error) {
	s.n.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.m[mode+"/"+kind]
	if k == nil {
		k = &kindStats{}
		s.m[mode+"/"+kind] = k
	}
	if err != nil {
		k.failed++
		if k.firstErr == nil {
			k.firstErr = err
		}
		return
	}
	k.ok++
	k.latencies = append(k.latencies, d)
}

func (s *stats) get(mode, kind string) kindStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.m[mode+"/"+kind]; k != nil {
		return *k
	}
	return kindStats{}
}

func (s *stats) report(d time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d peers in %v\n", s.n.Load(), d)
	for _, key := range keys {
		k := s.m[key]
		sort.Slice(k.latencies, func(i, j int) bool { return k.latencies[i] < k.latencies[j] })
		p := func(q float64) time.Duration {
			if len(k.latencies) == 0 {
				return 0
			}
			return k.latencies[int(q*float64(len(k.latencies)-1))].Round(100 * time.Microsecond)
		}
		fmt.Fprintf(&b, "%-30s ok %6d  failed %5d  p50 %8v  p99 %8v\n", key, k.ok, k.failed, p(0.5), p(0.99))
	}
	return b.String()
}
