package faults

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
	"github.com/servercount/servercount/test/upstream"
)

var (
	run = flag.Bool("faults", false, "run the fault matrix against our binaries and upstream's (make faults; needs root)")
	out = flag.String("faults.out", "", "write the matrix's table, in Markdown, to this file")
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The bounds the issue holds our binaries to, with default flags.
const (
	// dropOurs and dropUpstream bound the time from a server's death to
	// the agent's dropping it: against our server (heartbeats), and
	// against upstream's, which allows pings only every 30 s.
	dropOurs     = 15 * time.Second
	dropUpstream = 60 * time.Second
	// replaceBound bounds the time from the drop to holding the
	// replacement.
	replaceBound = 2 * time.Second
	// wholeBound bounds the time from a partition's healing to both
	// halves agreeing again.
	wholeBound = 30 * time.Second
	// slowDial is a dial that took too long: it waited on a dead agent.
	slowDial = 5 * time.Second
	// badDialsBound is how many dials may fail or be slow after an agent
	// turns deaf, and settleBound after how long none may.
	badDialsBound = 3
	settleBound   = 10 * time.Second
	// leaveBound bounds how long a pending dial of an agent that leaves
	// waits for its error.
	leaveBound = time.Second
	// watchUpstream is how long a fault is watched when nothing is
	// asserted: long enough to see upstream's binaries not recover.
	watchUpstream = 75 * time.Second
)

// matrix is the table the runs fill in.
var matrix struct {
	sync.Mutex
	rows []row
}

// row is one run: a fault, a pairing, what happened, and whether it was
// held to a bound.
type row struct {
	fault, pairing, result string
	asserted               bool
}

func record(fault, pairing string, asserted bool, format string, args ...any) {
	matrix.Lock()
	defer matrix.Unlock()
	matrix.rows = append(matrix.rows, row{fault, pairing, fmt.Sprintf(format, args...), asserted})
}

// table is the matrix in Markdown, in fault order.
func table(order []string) string {
	matrix.Lock()
	defer matrix.Unlock()
	rows := slices.Clone(matrix.rows)
	slices.SortStableFunc(rows, func(a, b row) int {
		if d := slices.Index(order, a.fault) - slices.Index(order, b.fault); d != 0 {
			return d
		}
		return strings.Compare(a.pairing, b.pairing)
	})
	var b strings.Builder
	b.WriteString("| fault | agent / server | what happened | held to the bound |\n| --- | --- | --- | --- |\n")
	for _, r := range rows {
		held := "no (measured)"
		if r.asserted {
			held = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.fault, r.pairing, r.result, held)
	}
	return b.String()
}

// sides returns our binaries and upstream's, or skips t.
func sides(t *testing.T) (ours, up impl) {
	t.Helper()
	if !*run {
		t.Skip("the fault matrix runs processes in network namespaces as root: make faults (go test ./test/faults -faults)")
	}
	if why := canMakeNamespaces(); why != "" {
		t.Fatal(why) // asked for by name: a matrix that runs nothing must not pass
	}
	b := upstream.Require(t)
	return impl{"ours", proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")},
		impl{"upstream", b.Server, b.Agent}
}

// pairing names an agent and a server side.
func pairing(agent, server impl) string { return agent.name + " / " + server.name }

// The faults, in the table's order.
const (
	faultFrozen    = "server frozen behind an L4 relay"
	faultBlackHole = "server black-holed (network namespace)"
	faultPartition = "partition of 45 s between agent and server, healed"
	faultStopped   = "server stopped (SIGSTOP), replaced at a new address"
	faultAgentStop = "agent stopped (SIGSTOP), 20 new tunnels/s"
	faultDeaf      = "agent answers pings, not dials, 20 new tunnels/s"
	faultLeaves    = "agent killed with a dial pending"
)

var faultOrder = []string{faultFrozen, faultBlackHole, faultPartition, faultStopped, faultAgentStop, faultDeaf, faultLeaves}

// TestFaultMatrix runs every fault against our binaries, held to the
// issue's bounds, and against upstream's, measured, side by side, and
// writes the table.
func TestFaultMatrix(t *testing.T) {
	ours, up := sides(t)
	c := writeCerts(t)
	t.Run("faults", func(t *testing.T) {
		for _, p := range []struct {
			agent, server impl
			bound         time.Duration // 0: measured only
		}{{ours, ours, dropOurs}, {ours, up, dropUpstream}, {up, up, 0}} {
			for _, fault := range []string{faultFrozen, faultBlackHole} {
				t.Run(fault+"/"+pairing(p.agent, p.server), func(t *testing.T) {
					t.Parallel()
					serverDies(t, fault, p.agent, p.server, c, p.bound)
				})
			}
		}
		for _, p := range []struct {
			agent, server impl
			assert        bool
		}{{ours, ours, true}, {up, up, false}} {
			t.Run(faultPartition+"/"+pairing(p.agent, p.server), func(t *testing.T) {
				t.Parallel()
				partitionHeals(t, p.agent, p.server, c, p.assert)
			})
		}
		for _, mode := range []string{"lb", "resolved"} {
			t.Run(faultStopped+"/ours "+mode, func(t *testing.T) {
				t.Parallel()
				serverStoppedAndReplaced(t, ours, mode, c)
			})
		}
		t.Run(faultStopped+"/upstream", func(t *testing.T) {
			t.Parallel()
			serverStoppedAndReplaced(t, up, "", c)
		})
		for _, p := range []struct {
			agent, server impl
			assert        bool
		}{{ours, ours, true}, {up, ours, true}, {up, up, false}} {
			t.Run(faultAgentStop+"/"+pairing(p.agent, p.server), func(t *testing.T) {
				t.Parallel()
				agentTurnsDeaf(t, faultAgentStop, p.agent, p.server, c, p.assert)
			})
		}
		for _, p := range []struct {
			agent, server impl
			assert        bool
		}{{ours, ours, true}, {up, up, false}} {
			t.Run(faultDeaf+"/"+pairing(p.agent, p.server), func(t *testing.T) {
				t.Parallel()
				agentTurnsDeaf(t, faultDeaf, p.agent, p.server, c, p.assert)
			})
			t.Run(faultLeaves+"/"+pairing(p.agent, p.server), func(t *testing.T) {
				t.Parallel()
				agentLeaves(t, p.agent, p.server, c, p.assert)
			})
		}
	})
	text := table(faultOrder)
	t.Logf("the fault matrix:\n%s", text)
	if *out != "" {
		require.NoError(t, os.WriteFile(*out, []byte(text), 0o644))
	}
}

// threeServers starts servers s1, s2 and s3 of impl, each in a namespace
// of its own, telling agents there are three, and a balancer in front of
// them, closed when t ends.
func threeServers(t *testing.T, srv impl, c certs, extra ...string) ([]*serverProc, []*netNS, *balancertest.Balancer) {
	t.Helper()
	var servers []*serverProc
	var nss []*netNS
	var addrs []string
	for i := 1; i <= 3; i++ {
		ns := newNetNS(t)
		s := startServer(t, srv.server, "s"+strconv.Itoa(i), 3, ns, c, extra...)
		servers, nss, addrs = append(servers, s), append(nss, ns), append(addrs, s.agentAddr)
	}
	lb, err := balancertest.New(addrs...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lb.Close() })
	return servers, nss, lb
}

// lbPort is the balancer's port.
func lbPort(t *testing.T, lb *balancertest.Balancer) int {
	t.Helper()
	_, p, err := net.SplitHostPort(lb.Addr())
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// holdsAll waits until the agent holds every server and each server has
// its one stream.
func holdsAll(t *testing.T, a *agentProc, servers ...*serverProc) {
	t.Helper()
	procs := []*proctest.Process{a.Process}
	for _, s := range servers {
		procs = append(procs, s.Process)
	}
	waitFor(t, 60*time.Second, "the agent holds every server", func() bool {
		if a.held() != float64(len(servers)) {
			return false
		}
		for _, s := range servers {
			if s.agents() != 1 {
				return false
			}
		}
		return true
	}, procs...)
}

// serverDies: one of three servers dies silently (frozen behind the
// balancer, or black-holed) while its replacement comes up behind the
// balancer, as a Deployment's would. Our agent must drop it within bound
// and hold the replacement within replaceBound after.
func serverDies(t *testing.T, fault string, ag, srv impl, c certs, bound time.Duration) {
	servers, nss, lb := threeServers(t, srv, c)
	a := startAgent(t, ag.agent, "a1", lbPort(t, lb), c)
	holdsAll(t, a, servers...)
	repl := startServer(t, srv.server, "s4", 3, newNetNS(t), c)

	lb.SetBackends(servers[1].agentAddr, servers[2].agentAddr, repl.agentAddr)
	if fault == faultFrozen {
		lb.Freeze(servers[0].agentAddr)
	} else {
		nss[0].BlackHole(t)
	}
	watch := max(bound, watchUpstream)
	// Dropped once the agent holds fewer, or holds the replacement: it
	// may dial it within one poll of the drop.
	dropped, ok := within(t.Context(), watch, func() bool { return a.held() < 3 || repl.agents() == 1 })
	if !ok {
		record(fault, pairing(ag, srv), bound > 0, "still held after %v (the agent counts %g open)", watch, a.held())
		require.Zero(t, bound, "the dead server was not dropped within %v", bound)
		return
	}
	replaced, ok := within(t.Context(), watch, func() bool { return a.held() == 3 && repl.agents() == 1 })
	if !ok {
		record(fault, pairing(ag, srv), bound > 0, "dropped in %v; the replacement not held after %v", round(dropped), watch)
	} else {
		record(fault, pairing(ag, srv), bound > 0, "dropped in %v, the replacement held %v later", round(dropped), round(replaced))
	}
	if bound > 0 {
		assert.LessOrEqual(t, dropped, bound, "the dead server was dropped too late")
		assert.True(t, ok, "the replacement was not held")
		assert.LessOrEqual(t, replaced, replaceBound, "the replacement was held too late")
	}
}

// partitionHeals: the path between the balancer (the agent's side) and
// one of three servers is cut for 45 s, then healed. Within wholeBound
// of the healing both halves agree again: the agent holds the three
// servers, and the cut-off server has exactly the agent's one stream.
func partitionHeals(t *testing.T, ag, srv impl, c certs, assertIt bool) {
	servers, nss, lb := threeServers(t, srv, c)
	a := startAgent(t, ag.agent, "a1", lbPort(t, lb), c)
	holdsAll(t, a, servers...)
	nss[0].BlackHole(t)
	// Longer than upstream's server takes to drop a silent agent (TCP
	// keepalive after 15 s idle, gRPC's 20 s TCP_USER_TIMEOUT): its
	// halves then disagree when the partition heals.
	time.Sleep(45 * time.Second) // the fault's length, not a synchronisation
	nss[0].Heal(t)
	watch := wholeBound
	if !assertIt {
		watch = watchUpstream
	}
	whole, ok := within(t.Context(), watch, func() bool { return a.held() == 3 && servers[0].agents() == 1 })
	if !ok {
		record(faultPartition, pairing(ag, srv), assertIt, "not whole %v after the healing: the agent holds %g, the cut-off server has %g agent streams", watch, a.held(), servers[0].agents())
		require.False(t, assertIt, "the halves did not agree within %v of the healing", wholeBound)
		return
	}
	record(faultPartition, pairing(ag, srv), assertIt, "whole %v after the healing", round(whole))
}

// serverStoppedAndReplaced: one of three servers is stopped (SIGSTOP:
// its kernel still answers TCP), and a replacement at a new address
// takes its place in DNS and behind the balancertest. Ours counts through
// DNS, dialing the balancer (lb) or each address DNS lists (resolved);
// upstream's takes the servers' count.
func serverStoppedAndReplaced(t *testing.T, ag impl, mode string, c certs) {
	const name = "_agent._tcp.proxy-server.faults.test."
	var (
		servers []*serverProc
		addrs   []string
	)
	for i := 1; i <= 4; i++ {
		s := startServer(t, ag.server, "s"+strconv.Itoa(i), 3, newNetNS(t), c)
		servers, addrs = append(servers, s), append(addrs, s.agentAddr)
	}
	repl := servers[3]
	lb, err := balancertest.New(addrs[:3]...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lb.Close() })
	var extra []string
	port := lbPort(t, lb)
	dns := dnstest.NewServer(t)
	dns.SetRecords(dnstest.SRVRecords(name, addrs[:3]...)...)
	if mode != "" {
		extra = append(extra, "--server-count-dns="+name, "--server-count-dns-server="+dns.Addr(), "--server-dial-mode="+mode)
		if mode == "resolved" {
			port = nsAgentPort
		}
	}
	a := startAgent(t, ag.agent, "a1", port, c, extra...)
	holdsAll(t, a, servers[:3]...)

	require.NoError(t, servers[0].Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = servers[0].Signal(syscall.SIGCONT) })
	dns.SetRecords(dnstest.SRVRecords(name, addrs[1:]...)...)
	lb.SetBackends(addrs[1:]...)
	pair := ag.name + " / " + ag.name
	if mode != "" {
		pair += ", DNS, " + mode
	}
	assertIt := ag.name == "ours"
	watch := dropOurs
	if !assertIt {
		watch = watchUpstream
	}
	dropped, ok := within(t.Context(), watch, func() bool { return a.held() < 3 || repl.agents() == 1 })
	if !ok {
		record(faultStopped, pair, assertIt, "still held after %v", watch)
		require.False(t, assertIt, "the stopped server was not dropped within %v", dropOurs)
		return
	}
	replaced, ok := within(t.Context(), watch, func() bool { return a.held() == 3 && repl.agents() == 1 })
	record(faultStopped, pair, assertIt, "dropped in %v, the replacement held %v later", round(dropped), round(replaced))
	if assertIt {
		assert.True(t, ok, "the replacement was not held")
		assert.LessOrEqual(t, replaced, replaceBound, "the replacement was held too late")
	}
}

// attempt is one new tunnel of the load: when it started, how long it
// took, and how it failed.
type attempt struct {
	start time.Time
	took  time.Duration
	err   error
}

// clientTimeout is how long a client of the load waits for its tunnel.
const clientTimeout = 15 * time.Second

// load opens a new tunnel through dial to target every interval until
// ctx ends, each echoing one byte, and returns every attempt once all
// have ended.
func load(ctx context.Context, dial churn.Dialer, target string, interval time.Duration) []attempt {
	var mu sync.Mutex
	var attempts []attempt
	var wg sync.WaitGroup
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return attempts
		case <-tick.C:
		}
		wg.Go(func() {
			a := attempt{start: time.Now()}
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), clientTimeout)
			defer cancel()
			a.err = echoOnce(actx, dial, target)
			a.took = time.Since(a.start)
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
		})
	}
}

// echoOnce opens a tunnel to an echo target and echoes one byte.
func echoOnce(ctx context.Context, dial churn.Dialer, target string) error {
	conn, err := dial(ctx, target)
	if err != nil {
		return err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	if _, err := conn.Write([]byte{'x'}); err != nil {
		return err
	}
	_, err = io.ReadFull(conn, make([]byte, 1))
	return err
}

// agentTurnsDeaf: two agents serve one server under 20 new tunnels a
// second; then one agent turns deaf: it is stopped (SIGSTOP), or a third
// agent joins whose transport answers pings and which answers no dial.
// After that at most badDialsBound tunnels may fail or take longer than
// slowDial, and none that starts settleBound after it.
func agentTurnsDeaf(t *testing.T, fault string, ag, srv impl, c certs, assertIt bool) {
	s := startServer(t, srv.server, "s1", 1, nil, c)
	_, port, err := net.SplitHostPort(s.agentAddr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	a1 := startAgent(t, ag.agent, "a1", p, c)
	a2 := startAgent(t, ag.agent, "a2", p, c)
	waitFor(t, 60*time.Second, "the server holds both agents", func() bool { return s.agents() == 2 }, s.Process, a1.Process, a2.Process)
	target := nettest.Serve(t, func(c net.Conn) { _, _ = io.Copy(c, c) })

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan []attempt, 1)
	go func() { done <- load(ctx, churn.ConnectOverUnix(s.socket), target, 50*time.Millisecond) }()
	time.Sleep(3 * time.Second) // load before the fault, not a synchronisation
	deafAt := time.Now()
	if fault == faultAgentStop {
		require.NoError(t, a2.Signal(syscall.SIGSTOP))
		t.Cleanup(func() { _ = a2.Signal(syscall.SIGCONT) })
	} else {
		deaf, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: s.agentAddr, TLS: c.agentTLS(t), ID: "deaf"})
		require.NoError(t, err)
		t.Cleanup(deaf.Close)
	}
	time.Sleep(30 * time.Second) // the load's length after the fault
	cancel()
	attempts := <-done

	var bad, late, after int
	var worst time.Duration
	for _, a := range attempts {
		if a.start.Before(deafAt) {
			continue
		}
		after++
		if a.err != nil || a.took > slowDial {
			bad++
			worst = max(worst, a.start.Sub(deafAt))
			if a.start.Sub(deafAt) >= settleBound {
				late++
			}
		}
	}
	result := fmt.Sprintf("%d of %d tunnels failed or took over %v, %d of them %v or more after the fault", bad, after, slowDial, late, settleBound)
	if bad > 0 {
		result += fmt.Sprintf("; the last started %v after it", round(worst))
	}
	record(fault, pairing(ag, srv), assertIt, "%s", result)
	if assertIt {
		assert.LessOrEqual(t, bad, badDialsBound, result)
		assert.Zero(t, late, result)
		assert.Positive(t, after)
	}
}

// agentLeaves: a tunnel's dial waits on the server's one agent (its
// endpoint hangs), and the agent is killed. The frontend must get its
// error within leaveBound, not when some timeout passes.
func agentLeaves(t *testing.T, ag, srv impl, c certs, assertIt bool) {
	s := startServer(t, srv.server, "s1", 1, nil, c)
	_, port, err := net.SplitHostPort(s.agentAddr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	a := startAgent(t, ag.agent, "a1", p, c)
	waitFor(t, 60*time.Second, "the server holds the agent", func() bool { return s.agents() == 1 }, s.Process, a.Process)

	hang := nettest.Blackhole(t)
	failed := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), watchUpstream)
		defer cancel()
		_ = echoOnce(ctx, churn.ConnectOverUnix(s.socket), hang)
		failed <- time.Now()
	}()
	waitFor(t, 30*time.Second, "the dial waits on the agent", func() bool {
		return value(s.metrics, "konnectivity_network_proxy_server_pending_backend_dials") == 1
	}, s.Process, a.Process)
	a.Kill()
	killed := time.Now()
	took := (<-failed).Sub(killed)
	record(faultLeaves, pairing(ag, srv), assertIt, "the pending dial failed %v after the kill", round(took))
	if assertIt {
		assert.LessOrEqual(t, took, leaveBound, "the pending dial waited after its agent left")
	}
}

// round rounds d for the table.
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
