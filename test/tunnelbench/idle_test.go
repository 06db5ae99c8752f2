package tunnelbench

import (
	"context"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
	"github.com/servercount/servercount/test/upstream"
)

var idleTunnels = flag.Int("tunnelbench.idle-tunnels", 20000, "idle tunnels BenchmarkUpstreamIdleTunnels opens through each pair at once, at most what the open file limit allows")

// spareFiles are the files this process holds beside two per tunnel (its
// end of the tunnel and the target's): listeners, the processes' pipes,
// the binaries.
const spareFiles = 500

// idleSettle is how long the processes idle before a sample: start-up
// garbage and the last dials' timers settle.
const idleSettle = 5 * time.Second

// BenchmarkUpstreamIdleTunnels opens -tunnelbench.idle-tunnels idle
// tunnels at once through each pair, ours and upstream's, in each
// frontend mode (one pair at a time, the tunnels of the last closed
// first), to a target that accepts and holds them, and reports what an
// idle open tunnel costs each process: resident memory (VmRSS), Go heap
// in use after a collection, and goroutines, less the same idle with no
// tunnel, divided by the tunnels; and ours over upstream's. Then it does
// the same for gRPC tunnels to test/cmd/grpc-floor (floorCost): what
// grpc-go alone holds per tunnel, below which no server on it goes.
// This process holds two files per tunnel: the tunnels are at most what
// its open file limit allows. It runs with make bench-upstream.
func BenchmarkUpstreamIdleTunnels(b *testing.B) {
	up := upstream.Require(b)
	n := min(*idleTunnels, (fileLimit(b)-spareFiles)/2)
	// --enable-profiling on every process, for a collection before each
	// sample (/debug/pprof/heap?gc=1). Our agent bounds the tunnels of
	// one server stream (5000 by default; upstream's has no bound): the
	// bound is raised to the tunnels asked for.
	f := startFixture(b, true, fmt.Sprintf("--max-tunnels-per-server=%d", n))
	f.startUpstream(b, up)
	target := holdTarget(b)
	costs := map[string]tunnelCost{} // by impl and mode
	var floor processCost
	for b.Loop() {
		for _, p := range append(f.pairs, f.upstream...) {
			c := idleCost(b, p, target, n)
			costs[p.impl+"-"+p.name] = c
			b.Logf("%s %s: per idle tunnel, server %.1f KiB RSS, %.1f KiB heap, %.2f goroutines; agent %.1f KiB RSS, %.1f KiB heap, %.2f goroutines",
				p.impl, p.mode, c.server.rssKiB, c.server.heapKiB, c.server.goroutines, c.agent.rssKiB, c.agent.heapKiB, c.agent.goroutines)
		}
		floor = floorCost(b, n)
	}
	table := idleTable(costs, n, up.Commit)
	upstreamGRPC := costs["upstream-grpc"].server
	table += fmt.Sprintf("| grpc, grpc-go alone (test/cmd/grpc-floor) | %.1f KiB (%.2fx of upstream's server) | %.1f KiB | %.2f |\n",
		floor.rssKiB, floor.rssKiB/upstreamGRPC.rssKiB, floor.heapKiB, floor.goroutines)
	b.Logf("\n%s", table)
	appendOut(b, table)
	b.ReportMetric(float64(n), "tunnels")
	eachCost(costs, func(mode, side string, ours, them processCost) {
		b.ReportMetric(ours.rssKiB, side+"-rss-KiB/tunnel-"+mode)
		b.ReportMetric(them.rssKiB, "upstream-"+side+"-rss-KiB/tunnel-"+mode)
		b.ReportMetric(ours.rssKiB/them.rssKiB, "ours/upstream-"+side+"-rss-"+mode)
		b.ReportMetric(ours.heapKiB, side+"-heap-KiB/tunnel-"+mode)
		b.ReportMetric(them.heapKiB, "upstream-"+side+"-heap-KiB/tunnel-"+mode)
		b.ReportMetric(ours.goroutines, side+"-goroutines/tunnel-"+mode)
		b.ReportMetric(them.goroutines, "upstream-"+side+"-goroutines/tunnel-"+mode)
	})
	b.ReportMetric(floor.rssKiB, "floor-server-rss-KiB/tunnel-grpc")
	b.ReportMetric(floor.rssKiB/upstreamGRPC.rssKiB, "floor/upstream-server-rss-grpc")
	b.ReportMetric(floor.goroutines, "floor-server-goroutines/tunnel-grpc")
	b.ReportMetric(0, "ns/op")
}

// floorCost is what an idle gRPC tunnel costs a server that is grpc-go
// and nothing else: it starts test/cmd/grpc-floor with its frontend on a
// Unix socket, opens n tunnels through it at once as kube-apiserver does
// (a gRPC connection each), and samples it idle before and after, as
// idleCost does a pair's server. The tunnels lead nowhere: the floor
// answers each DIAL_REQ itself.
func floorCost(b *testing.B, n int) processCost {
	b.Helper()
	socket := filepath.Join(b.TempDir(), "floor.sock")
	adminPort := nettest.FreePorts(b, 1)[0]
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	p := proctest.Start(b, proctest.Build(b, "test/cmd/grpc-floor"), "--frontend-uds="+socket, "--admin-port="+strconv.Itoa(adminPort))
	defer p.Kill()
	tunnels := func() float64 {
		m, err := proctest.Scrape(admin + "/metrics")
		if err != nil {
			return -1
		}
		v, _ := m.Value("konnectivity_network_proxy_server_grpc_connections", "service_method", "Proxy")
		return v
	}
	require.Eventually(b, func() bool { return tunnels() == 0 }, time.Minute, 50*time.Millisecond, "grpc-floor never served its metrics")
	settle(b)
	before := sampleProcess(b, p.Process.Pid, admin)
	// The tunnels live as long as ctx.
	ctx, closeTunnels := context.WithCancel(b.Context())
	defer closeTunnels()
	conns, err := openTunnels(ctx, dialFunc(churn.GRPCOverUnix(socket)), "nowhere:1", n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	if err != nil {
		b.Fatalf("open %d tunnels through grpc-floor: %v", n, err)
	}
	settle(b)
	after := sampleProcess(b, p.Process.Pid, admin)
	if got := tunnels(); got != float64(n) {
		b.Fatalf("grpc-floor holds %v tunnels, want %d", got, n)
	}
	return perTunnel(before, after, n)
}

// idleTable is the markdown table of costs: per idle tunnel, for each
// mode and process, ours, upstream's and the ratio.
func idleTable(costs map[string]tunnelCost, n int, commit string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Per idle open tunnel, %d open at once through one pair, beside upstream %s:\n\n", n, commit)
	sb.WriteString("| mode, process | RSS ours / upstream's | heap ours / upstream's | goroutines ours / upstream's |\n| --- | --- | --- | --- |\n")
	eachCost(costs, func(mode, side string, ours, them processCost) {
		fmt.Fprintf(&sb, "| %s, %s | %.1f / %.1f KiB (%.2fx) | %.1f / %.1f KiB | %.2f / %.2f |\n", mode, side,
			ours.rssKiB, them.rssKiB, ours.rssKiB/them.rssKiB, ours.heapKiB, them.heapKiB, ours.goroutines, them.goroutines)
	})
	return sb.String()
}

// eachCost calls f with ours and upstream's cost for each frontend mode
// and process.
func eachCost(costs map[string]tunnelCost, f func(mode, side string, ours, them processCost)) {
	for _, mode := range []string{"connect", "grpc"} {
		ours, theirs := costs["ours-"+mode], costs["upstream-"+mode]
		f(mode, "server", ours.server, theirs.server)
		f(mode, "agent", ours.agent, theirs.agent)
	}
}

// processCost is what one process spends per idle tunnel.
type processCost struct{ rssKiB, heapKiB, goroutines float64 }

// tunnelCost is what an idle tunnel costs a pair's server and agent.
type tunnelCost struct{ server, agent processCost }

// processSample is one process's memory and goroutines.
type processSample struct{ rssKiB, heap, goroutines float64 }

// idleCost samples p's processes idle, opens n tunnels through p to
// target at once, samples them again, and closes the tunnels, waiting
// until the target has seen every one end.
func idleCost(b *testing.B, p *pair, target *heldTarget, n int) tunnelCost {
	b.Helper()
	settle(b)
	s0, a0 := sampleProcess(b, p.serverPID, p.serverAdmin), sampleProcess(b, p.agentPID, p.agentAdmin)
	ctx, closeTunnels := context.WithCancel(b.Context())
	conns, err := openTunnels(ctx, p.dial(), target.addr, n)
	if err != nil {
		closeTunnels()
		b.Fatalf("%s %s: open %d tunnels: %v", p.impl, p.mode, n, err)
	}
	if err := target.waitHeld(b.Context(), n); err != nil {
		closeTunnels()
		b.Fatalf("%s %s: %v", p.impl, p.mode, err)
	}
	settle(b)
	s1, a1 := sampleProcess(b, p.serverPID, p.serverAdmin), sampleProcess(b, p.agentPID, p.agentAdmin)
	closeTunnels()
	for _, c := range conns {
		_ = c.Close()
	}
	if err := target.waitHeld(b.Context(), 0); err != nil {
		b.Fatalf("%s %s: closing the tunnels: %v", p.impl, p.mode, err)
	}
	return tunnelCost{server: perTunnel(s0, s1, n), agent: perTunnel(a0, a1, n)}
}

// openTunnels opens n tunnels to addr with dial, 64 at a time; they live
// as long as ctx. On an error it returns those it opened, to be closed.
func openTunnels(ctx context.Context, dial dialFunc, addr string, n int) ([]net.Conn, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	var mu sync.Mutex
	var conns []net.Conn
	for range n {
		g.Go(func() error {
			c, err := dial(ctx, addr)
			if err != nil {
				return err
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			return gctx.Err()
		})
	}
	err := g.Wait()
	return conns, err
}

// perTunnel is what each of n tunnels added to a process between two
// samples.
func perTunnel(before, after processSample, n int) processCost {
	return processCost{
		rssKiB:     (after.rssKiB - before.rssKiB) / float64(n),
		heapKiB:    (after.heap - before.heap) / 1024 / float64(n),
		goroutines: (after.goroutines - before.goroutines) / float64(n),
	}
}

// settle idles for idleSettle, or until b ends.
func settle(b *testing.B) {
	t := time.NewTimer(idleSettle)
	defer t.Stop()
	select {
	case <-t.C:
	case <-b.Context().Done():
	}
}

// sampleProcess collects garbage in the process pid whose admin port is
// admin, twice, then reads its resident memory, heap in use and goroutines.
func sampleProcess(b *testing.B, pid int, admin string) processSample {
	b.Helper()
	// Twice: what sync.Pools hold survives one collection.
	for range 2 {
		_ = proctest.Status(admin + "/debug/pprof/heap?gc=1")
	}
	m, err := proctest.Scrape(admin + "/metrics")
	if err != nil {
		b.Fatalf("scrape %s: %v", admin, err)
	}
	rss, err := proctest.StatusKiB(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	heap, _ := m.Value("go_memstats_heap_inuse_bytes")
	g, _ := m.Value("go_goroutines")
	return processSample{rssKiB: float64(rss), heap: heap, goroutines: g}
}

// heldTarget accepts TCP connections on loopback and holds them open
// until their other end closes, counting them.
type heldTarget struct {
	addr string
	mu   sync.Mutex
	held int
	wake chan struct{} // buffer of 1: held changed
}

func holdTarget(b *testing.B) *heldTarget {
	b.Helper()
	t := &heldTarget{wake: make(chan struct{}, 1)}
	t.addr = nettest.Serve(b, func(c net.Conn) {
		t.add(1)
		defer t.add(-1)
		var one [1]byte
		for {
			if _, err := c.Read(one[:]); err != nil {
				return
			}
		}
	})
	return t
}

func (t *heldTarget) add(d int) {
	t.mu.Lock()
	t.held += d
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// waitHeld waits until the target holds n connections, for at most
// opTimeout.
func (t *heldTarget) waitHeld(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	for {
		t.mu.Lock()
		held := t.held
		t.mu.Unlock()
		if held == n {
			return nil
		}
		select {
		case <-t.wake:
		case <-ctx.Done():
			return fmt.Errorf("the target holds %d connections, want %d: %w", held, n, ctx.Err())
		}
	}
}

// fileLimit raises this process's open file limit to its hard limit,
// which the processes it starts inherit, and returns it. Only a process
// with CAP_SYS_RESOURCE may raise the hard limit itself.
func fileLimit(b *testing.B) int {
	b.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatalf("read the open file limit: %v", err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatalf("raise the open file limit: %v", err)
	}
	return int(min(lim.Max, 1<<20))
}
