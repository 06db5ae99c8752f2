package fleet

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/test/upstream"
)

// BenchmarkAgentProcess runs one proxy-agent binary, as a process, against
// the fleet's 3 servers through DNS in resolved mode, with TLS and a
// token, and reports its resident memory (VmRSS) and goroutines once it
// holds the 3 servers and again after idling for a while.
func BenchmarkAgentProcess(b *testing.B) {
	bin := proctest.Build(b, "cmd/proxy-agent")
	f := New(b, Config{Agents: 1, Mode: agent.DialResolved})
	pair, err := f.env.CA.Client("agent-process")
	require.NoError(b, err)
	dir, cert, key, ca := writeTLSFiles(b, f, pair)
	token := filepath.Join(dir, "token")
	require.NoError(b, os.WriteFile(token, []byte(agentToken("agent-process")), 0o600))
	host, port, err := net.SplitHostPort(f.lb.Addr())
	require.NoError(b, err)
	ports := nettest.FreePorts(b, 2)

	serverPort, err := strconv.Atoi(port)
	require.NoError(b, err)
	p := proctest.Start(b, bin, proctest.AgentFlags{ID: "agent-process", ServerHost: host, ServerPort: serverPort,
		CA: ca, Cert: cert, Key: key, HealthPort: ports[0], AdminPort: ports[1]}.Args(
		"--service-account-token-path="+token,
		"--server-count-dns="+SRVName, "--server-count-dns-server="+f.dns.Addr(),
		"--server-dial-mode=resolved")...)
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	if _, err := f.WaitServers(ctx, f.Servers(), 1); err != nil {
		b.Fatalf("agent process: %v\n%s", err, p.Output())
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	report := func(when string) {
		for field, unit := range map[string]string{"VmRSS": "rss", "RssAnon": "rss-anon", "RssFile": "rss-file"} {
			kib, err := proctest.StatusKiB(p.Process.Pid, field)
			require.NoError(b, err)
			b.ReportMetric(float64(kib)/1024, unit+"-MiB-"+when)
		}
		if m, err := proctest.Scrape(metrics); err == nil {
			if g, ok := m.Value("go_goroutines"); ok {
				b.ReportMetric(g, "goroutines-"+when)
			}
			// How much of the resident set is Go's heap.
			if h, ok := m.Value("go_memstats_heap_inuse_bytes"); ok {
				b.ReportMetric(h/(1<<20), "heap-inuse-MiB-"+when)
			}
		}
	}
	report("connected")
	// Idle for a while: the DNS counter refreshes, timers run, the GC
	// settles.
	idle := time.NewTimer(15 * time.Second)
	select {
	case <-idle.C:
	case <-b.Context().Done():
	}
	report("idle")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkServerProcess runs our proxy-server binary, then upstream's
// (built from ../shared/upstream), each as a process, with the
// -fleet.agents agents of the fleet (in this process, resolved mode, TLS)
// connected to it, and reports what each agent stream costs each server:
// its resident memory, Go heap and goroutines idle with every agent
// connected, less the same idle with none, divided by the agents; and
// ours over upstream's. The agents move from our server to upstream's
// through DNS, as in a rollout, then to grpc-floor (test/cmd): the
// same gRPC transport and TLS with nothing of a proxy-server's, which
// shows how little of the rest is ours to cut.
func BenchmarkServerProcess(b *testing.B) {
	n := *flagAgents
	up := upstream.Require(b)
	f := New(b, Config{Agents: n, Servers: 1})
	ours := streamCost(b, f, serverProcess(b, f, proctest.Build(b, "cmd/proxy-server")), "ours", nil)
	theirs := streamCost(b, f, serverProcess(b, f, up.Server), "upstream", ours.p)
	floor := streamCost(b, f, floorProcess(b, f), "floor", theirs.p)

	b.ReportMetric(float64(n), "agents")
	for _, c := range []struct {
		impl string
		c    serverCost
	}{{"", ours}, {"upstream-", theirs}, {"floor-", floor}} {
		b.ReportMetric(c.c.before.rssKiB/1024, c.impl+"rss-MiB-no-agents")
		b.ReportMetric(c.c.after.rssKiB/1024, c.impl+"rss-MiB-all-agents")
		b.ReportMetric(c.c.per(func(s sample) float64 { return s.rssKiB }), c.impl+"rss-KiB/stream")
		b.ReportMetric(c.c.per(func(s sample) float64 { return s.heap / 1024 }), c.impl+"heap-KiB/stream")
		b.ReportMetric(c.c.per(func(s sample) float64 { return s.stack / 1024 }), c.impl+"stack-KiB/stream")
		b.ReportMetric(c.c.per(func(s sample) float64 { return s.goroutines }), c.impl+"goroutines/stream")
	}
	rss := func(s sample) float64 { return s.rssKiB }
	b.ReportMetric(ours.per(rss)/theirs.per(rss), "ours/upstream-rss")
	b.ReportMetric(floor.per(rss)/theirs.per(rss), "floor/upstream-rss")
	b.ReportMetric(0, "ns/op")
}

// sample is a server process's memory and goroutines.
type sample struct{ rssKiB, heap, stack, goroutines float64 }

// serverCost is a server process sampled idle without agents and with
// every agent connected.
type serverCost struct {
	p             *proctest.Process
	n             int
	before, after sample
}

// per is what one agent stream adds to v.
func (c serverCost) per(v func(sample) float64) float64 {
	return (v(c.after) - v(c.before)) / float64(c.n)
}

// streamCost starts a server with start, samples it idle, then has every
// agent of f connect to it (starting them, or stopping previous, the
// server they hold) and samples it again.
func streamCost(b *testing.B, f *Fleet, start func(string, ...string) (*proctest.Process, []int), impl string, previous *proctest.Process) serverCost {
	n := *flagAgents
	// --enable-profiling for /debug/pprof/heap?gc=1: a GC before each
	// sample.
	p, ports := start("server-process-"+impl, "--enable-profiling")
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[3])
	scrape := func() proctest.Metrics {
		m, err := proctest.Scrape(metrics)
		if err != nil {
			return nil
		}
		return m
	}
	streams := func() float64 {
		v, _ := scrape().Value("konnectivity_network_proxy_server_grpc_connections", "service_method", "Connect")
		return v
	}
	// Each sample is taken after idling, so that start-up garbage is
	// collected and timers have settled.
	idleSample := func() sample {
		idle := time.NewTimer(10 * time.Second)
		select {
		case <-idle.C:
		case <-b.Context().Done():
		}
		// The heap profile handler collects garbage first when asked;
		// twice, since what sync.Pools hold (gRPC's write buffers among
		// them) survives one collection.
		for range 2 {
			_ = proctest.Status(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", ports[3]))
		}
		rss, err := proctest.StatusKiB(p.Process.Pid, "VmRSS")
		require.NoError(b, err)
		m := scrape()
		require.NotNil(b, m, "scrape the %s server process's metrics\n%s", impl, p.Output())
		heap, _ := m.Value("go_memstats_heap_inuse_bytes")
		stack, _ := m.Value("go_memstats_stack_inuse_bytes")
		g, _ := m.Value("go_goroutines")
		return sample{rssKiB: float64(rss), heap: heap, stack: stack, goroutines: g}
	}
	require.Eventually(b, func() bool { return scrape() != nil }, time.Minute, 50*time.Millisecond,
		"the %s server process never served its metrics\n%s", impl, p.Output())
	c := serverCost{p: p, n: n, before: idleSample()}

	f.PublishAddrs(net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])))
	if previous == nil {
		f.StartAgents()
	} else {
		previous.Kill() // the agents drop it and dial this one
	}
	require.Eventually(b, func() bool { return streams() == float64(n) }, benchWait, 100*time.Millisecond,
		"%d agents never all connected to the %s server process (%v streams)\n%s", n, impl, streams(), p.Output())
	c.after = idleSample()
	require.Equal(b, float64(n), streams(), "agent streams dropped while idle")
	if *flagHeapProfile != "" && previous == nil {
		saveURL(b, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", ports[3]), *flagHeapProfile)
	}
	return c
}

// serverProcess returns what starts the proxy-server binary bin, ours
// or upstream's, as a process for f's agents, with TLS from f's CA, on
// loopback ports: the frontend, agent, health and admin ports, in that
// order. extra are more flags. The process inherits a raised file limit.
func serverProcess(b *testing.B, f *Fleet, bin string) func(id string, extra ...string) (*proctest.Process, []int) {
	raiseFileLimit(b)
	pair, err := f.env.CA.Server("proxy-server-process")
	require.NoError(b, err)
	_, cert, key, ca := writeTLSFiles(b, f, pair)
	return func(id string, extra ...string) (*proctest.Process, []int) {
		ports := nettest.FreePorts(b, 4)
		return proctest.Start(b, bin, proctest.ServerFlags{Mode: "grpc", ID: id,
			FrontendPort: ports[0], AgentPort: ports[1], HealthPort: ports[2], AdminPort: ports[3],
			Cert: cert, Key: key, CA: ca}.Args(extra...)...), ports
	}
}

// floorProcess returns what starts test/cmd/grpc-floor, the least
// an agent port built on grpc-go and crypto/tls can be, as serverProcess
// does a server. Of the extra flags it passes on only
// --heartbeat-interval, the one grpc-floor shares with the
// proxy-server; only the agent and admin ports are its own.
func floorProcess(b *testing.B, f *Fleet) func(id string, extra ...string) (*proctest.Process, []int) {
	bin := proctest.Build(b, "test/cmd/grpc-floor")
	raiseFileLimit(b)
	pair, err := f.env.CA.Server("grpc-floor-process")
	require.NoError(b, err)
	_, cert, key, ca := writeTLSFiles(b, f, pair)
	return func(_ string, extra ...string) (*proctest.Process, []int) {
		ports := nettest.FreePorts(b, 4)
		args := []string{"--agent-port=" + strconv.Itoa(ports[1]), "--admin-port=" + strconv.Itoa(ports[3]),
			"--cert=" + cert, "--key=" + key, "--ca=" + ca}
		for _, x := range extra {
			if strings.HasPrefix(x, "--heartbeat-interval=") {
				args = append(args, x)
			}
		}
		return proctest.Start(b, bin, args...), ports
	}
}

// saveURL writes the body of a GET of url to path.
func saveURL(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	require.NoError(b, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(path, body, 0o644))
}

// writeTLSFiles writes pair and the fleet's CA into a new directory, for
// a binary's TLS flags.
func writeTLSFiles(b *testing.B, f *Fleet, pair *pkitest.Pair) (dir, cert, key, ca string) {
	dir = b.TempDir()
	cert, key, err := pair.WriteFiles(dir, "tls")
	require.NoError(b, err)
	ca, err = f.env.CA.WriteFile(dir, "ca")
	require.NoError(b, err)
	return dir, cert, key, ca
}

// BenchmarkIdleCost measures what liveness costs an idle fleet: the CPU
// that one proxy-server binary, as a process, and the -fleet.agents
// agents of the fleet (this process) spend over -fleet.idle while nothing
// is asked of them, first with the server's heartbeats off
// (--heartbeat-interval=0: the agents' offers go unanswered, so neither
// end sends any, as between upstream's binaries), then with
// -fleet.heartbeat (default 5 s, the binary's), in the same run; the
// agents offer -fleet.agent-heartbeat (default theirs, 5 s). Then the
// same for grpc-floor (test/cmd), grpc-go that sends the heartbeats and
// does nothing else: what of the heartbeats' cost is grpc-go's. The
// agents move from each server to the next through DNS, as in a rollout.
func BenchmarkIdleCost(b *testing.B) {
	n := *flagAgents
	f := New(b, Config{Agents: n, Servers: 1, EditAgent: func(cfg *agent.Config) {
		cfg.Heartbeat = cmp.Or(*flagAgentHeartbeat, cfg.Heartbeat)
	}})
	ours := serverProcess(b, f, proctest.Build(b, "cmd/proxy-server"))
	floor := floorProcess(b, f)
	// phase is what the server process and the agents spent in one idle
	// phase, and the HEARTBEAT packets the server received and sent.
	type phase struct {
		server, agents time.Duration
		in, out        float64
	}
	// measure starts a server (ours or the floor, by name) with
	// heartbeat, publishes it in place of previous, which it then stops,
	// and measures the idle fleet.
	measure := func(name string, start func(string, ...string) (*proctest.Process, []int), heartbeat string, previous *proctest.Process) (phase, *proctest.Process) {
		flags := []string{"--heartbeat-interval=" + heartbeat}
		if *flagCPUProfile != "" {
			flags = append(flags, "--enable-profiling")
		}
		p, ports := start("server-"+heartbeat, flags...)
		metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[3])
		streams := func() float64 {
			m, err := proctest.Scrape(metrics)
			if err != nil {
				return -1
			}
			v, _ := m.Value("konnectivity_network_proxy_server_grpc_connections", "service_method", "Connect")
			return v
		}
		heartbeats := func() (in, out float64) {
			m, err := proctest.Scrape(metrics)
			require.NoError(b, err)
			in, _ = m.Value("konnectivity_network_proxy_server_stream_packets_total", "segment", "from_agent", "packet_type", "HEARTBEAT")
			out, _ = m.Value("konnectivity_network_proxy_server_stream_packets_total", "segment", "to_agent", "packet_type", "HEARTBEAT")
			return in, out
		}
		f.PublishAddrs(net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])))
		if previous == nil {
			f.StartAgents()
		} else {
			previous.Kill() // the agents drop it and dial the new one
		}
		require.Eventually(b, func() bool { return streams() == float64(n) }, benchWait, 100*time.Millisecond,
			"%d agents never all connected to the server with heartbeats %s (%v streams)\n%s", n, heartbeat, streams(), p.Output())
		// Settle: start-up garbage, the agents' last dials, the old
		// server's streams.
		settle := time.NewTimer(15 * time.Second)
		select {
		case <-settle.C:
		case <-b.Context().Done():
		}
		in0, out0 := heartbeats()
		server0, agents0 := processCPU(b, p.Process.Pid), cpuTime()
		if *flagCPUProfile != "" {
			// The profile spans the idle phase: the handler returns after
			// it.
			saveURL(b, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", ports[3], int(flagIdle.Seconds())), *flagCPUProfile+"-"+name+"-"+heartbeat)
		} else {
			idle := time.NewTimer(*flagIdle)
			select {
			case <-idle.C:
			case <-b.Context().Done():
			}
		}
		got := phase{server: processCPU(b, p.Process.Pid) - server0, agents: cpuTime() - agents0}
		in1, out1 := heartbeats()
		got.in, got.out = in1-in0, out1-out0
		require.Equal(b, float64(n), streams(), "agent streams dropped while idle with heartbeats %s", heartbeat)
		return got, p
	}
	off, p := measure("ours", ours, "0", nil)
	on, p := measure("ours", ours, flagHeartbeat.String(), p)
	floorOff, p := measure("floor", floor, "0", p)
	floorOn, _ := measure("floor", floor, flagHeartbeat.String(), p)
	secs := flagIdle.Seconds()
	perStream := func(d time.Duration) float64 { return float64(d.Microseconds()) / secs / float64(n) }
	b.ReportMetric(float64(n), "agents")
	b.ReportMetric(float64(off.server.Milliseconds())/secs, "server-cpu-ms/s-off")
	b.ReportMetric(float64(on.server.Milliseconds())/secs, "server-cpu-ms/s-heartbeats")
	b.ReportMetric(perStream(on.server-off.server), "server-cpu-us/s-per-stream-for-heartbeats")
	b.ReportMetric(float64(off.agents.Milliseconds())/secs, "agents-cpu-ms/s-off")
	b.ReportMetric(float64(on.agents.Milliseconds())/secs, "agents-cpu-ms/s-heartbeats")
	b.ReportMetric(perStream(on.agents-off.agents), "agents-cpu-us/s-per-stream-for-heartbeats")
	b.ReportMetric(on.in/secs/float64(n), "heartbeats-in/s/stream")
	b.ReportMetric(on.out/secs/float64(n), "heartbeats-out/s/stream")
	if off.server > 0 {
		b.ReportMetric(float64(on.server)/float64(off.server), "server-cpu-ratio")
	}
	b.ReportMetric(float64(floorOff.server.Milliseconds())/secs, "floor-cpu-ms/s-off")
	b.ReportMetric(float64(floorOn.server.Milliseconds())/secs, "floor-cpu-ms/s-heartbeats")
	b.ReportMetric(perStream(floorOn.server-floorOff.server), "floor-cpu-us/s-per-stream-for-heartbeats")
	b.ReportMetric(perStream(floorOn.agents-floorOff.agents), "floor-agents-cpu-us/s-per-stream-for-heartbeats")
	b.ReportMetric(floorOn.in/secs/float64(n), "floor-heartbeats-in/s/stream")
	b.ReportMetric(floorOn.out/secs/float64(n), "floor-heartbeats-out/s/stream")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the CPU time process pid has used, from /proc/<pid>/stat
// (user and system, in clock ticks of 10 ms).
func processCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(b, err)
	// The command may hold spaces: the fields start after its ')'.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	require.NoError(b, err)
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	require.NoError(b, err)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
