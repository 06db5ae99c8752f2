package churn_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
	"github.com/servercount/servercount/test/upstream"
)

var (
	integrity    = flag.Bool("integrity", false, "run TestIntegrityProcesses (make integrity)")
	integrityOut = flag.String("integrity.out", "", "write the table of TestIntegrityProcesses to this file")
	// integrityTunnels is how many tunnels each pairing and frontend
	// runs, at least.
	integrityTunnels = flag.Int("integrity.tunnels", 1000, "tunnels per pairing and frontend, at least")
)

// integrityFrontends are the frontends of the run: HTTP CONNECT, a gRPC
// connection per tunnel (konnectivity-client's single-use tunnel), and
// one gRPC connection for all (its reusable tunnel).
var integrityFrontends = []struct{ name, mode string }{
	{"http-connect", "http-connect"},
	{"grpc", "grpc"},
	{"grpc-shared", "grpc"},
}

// integrityDialer returns the Dialer of frontend fe through socket.
func integrityDialer(t *testing.T, fe, socket string) churn.Dialer {
	if fe != "grpc-shared" {
		return churn.OverUnix(fe, socket)
	}
	dial, err := churn.GRPCSharedOverUnix(t.Context(), socket)
	require.NoError(t, err)
	return dial
}

// recordWait is how long a run waits for the target to learn that a
// tunnel ended: for our pair far beyond what a healthy tunnel takes on a
// loaded machine, as any wait that ends is a failure of the test; for
// the measured pairings less, as upstream's agent drops whole tunnels
// (see churn.RunIntegrity) and each costs the wait.
func recordWait(held bool) time.Duration {
	if held {
		return 30 * time.Second
	}
	return 5 * time.Second
}

// integrityRow is a line of the table.
type integrityRow struct {
	pairing, frontend, phase string
	churn.Tally
	took time.Duration
}

// Every byte of every tunnel, both ways, through the binaries as
// processes in all four pairings of ours and upstream's, in each
// frontend: the checker (churn.RunIntegrity) sends a known stream each
// way and both ends check it byte for byte, so that a tunnel that ends
// cleanly after fewer bytes than were sent (a silent loss) shows.
// The cases: the client closes or half-closes after N bytes, the target
// sends N and closes, slow readers while the other end has closed, a
// request and its answer, 64 tunnels whose targets all close at one
// instant; then SIGTERM to the server, and to the agent, while 64
// tunnels are mid-transfer, and an agent replaced by another meanwhile.
// Our pair must deliver every tunnel (0 silent, 0 failed), and our server
// every tunnel of upstream's agent on SIGTERM; the mixed pairings must
// lose, in all, no more tunnels than upstream's own pair in the same run,
// which is measured and reported.
func TestIntegrityProcesses(t *testing.T) {
	if !*integrity {
		t.Skip("the integrity run takes minutes: make integrity (go test -run TestIntegrityProcesses ./test/churn -integrity)")
	}
	up := upstream.Require(t)
	ours := binaries{"ours", proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")}
	theirs := binaries{"upstream", up.Server, up.Agent}
	certs := writeCerts(t)
	target := churn.StartIntegrityTarget(t)

	var mu sync.Mutex
	var rows []integrityRow
	add := func(r integrityRow) {
		mu.Lock()
		defer mu.Unlock()
		rows = append(rows, r)
	}
	var id uint64
	nextIDs := func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		id += 1 << 32
		return id
	}
	for _, srv := range []binaries{ours, theirs} {
		for _, ag := range []binaries{ours, theirs} {
			pairing := fmt.Sprintf("server=%s/agent=%s", srv.name, ag.name)
			held := srv.name == "ours" && ag.name == "ours"
			for _, fe := range integrityFrontends {
				t.Run(pairing+"/"+fe.name, func(t *testing.T) {
					p := startPair(t, srv.server, ag.agent, fe.mode, certs)
					dial := integrityDialer(t, fe.name, p.socket)
					start := time.Now()
					var all []churn.Outcome
					for _, round := range churn.IntegrityTunnels(nextIDs(), *integrityTunnels) {
						all = append(all, churn.RunIntegrity(t.Context(), dial, target, round, 64, recordWait(held))...)
					}
					tally := churn.Count(all)
					add(integrityRow{pairing, fe.name, "cases", tally, time.Since(start)})
					report(t, held, tally, all)
					if srv.name == "ours" {
						// Every tunnel closed at the server too: none
						// established, none pending, none left to deliver.
						assert.Eventually(t, func() bool { return openAtServer(p) == 0 }, 30*time.Second, 20*time.Millisecond,
							"tunnels left open at the server: %v", openAtServer(p))
					}
				})
				t.Run(pairing+"/"+fe.name+"/agent-replaced", func(t *testing.T) {
					p := startPair(t, srv.server, ag.agent, fe.mode, certs)
					dial := integrityDialer(t, fe.name, p.socket)
					start := time.Now()
					all := agentReplacedMidTransfer(t, p, dial, target, nextIDs(), recordWait(held))
					tally := churn.Count(all)
					add(integrityRow{pairing, fe.name, "agent replaced", tally, time.Since(start)})
					report(t, held, tally, all)
				})
				for _, victim := range []string{"server", "agent"} {
					t.Run(pairing+"/"+fe.name+"/sigterm-"+victim, func(t *testing.T) {
						p := startPair(t, srv.server, ag.agent, fe.mode, certs)
						dial := integrityDialer(t, fe.name, p.socket)
						proc := p.server
						if victim == "agent" {
							proc = p.agent
						}
						// Our server's graceful stop keeps every agent's
						// tunnels, upstream's agent's too.
						held := held || victim == "server" && srv.name == "ours"
						start := time.Now()
						all := sigtermMidTransfer(t, dial, target, nextIDs(), proc, recordWait(held))
						tally := churn.Count(all)
						add(integrityRow{pairing, fe.name, "SIGTERM to the " + victim, tally, time.Since(start)})
						report(t, held, tally, all)
					})
				}
			}
		}
	}
	// The mixed pairs lose no more than upstream's own pair in the same
	// run, in all and in each frontend's cases: each half of ours leaves
	// its upstream half no worse off than upstream's own other half does.
	lost := map[string]int{}
	for _, r := range rows {
		lost[r.pairing] += r.Tunnels - r.Delivered
		if r.phase == "cases" {
			lost[r.pairing+" "+r.frontend] += r.Tunnels - r.Delivered
		}
	}
	const oracle = "server=upstream/agent=upstream"
	for _, mixed := range []string{"server=ours/agent=upstream", "server=upstream/agent=ours"} {
		for _, part := range []string{"", " http-connect", " grpc", " grpc-shared"} {
			want, ran := lost[oracle+part]
			if n, ok := lost[mixed+part]; ok && ran {
				assert.LessOrEqual(t, n, want, "tunnels not delivered with %s%s, against upstream's own pair", mixed, part)
			}
		}
	}
	table := integrityTable(rows)
	t.Log("\n" + table)
	if *integrityOut != "" {
		require.NoError(t, os.WriteFile(*integrityOut, []byte(table), 0o644))
	}
}

// sigtermMidTransfer runs 64 DownSlow tunnels of 1 MiB and sends proc
// SIGTERM once all of them have reached the target, while their clients
// still read.
// Our server keeps open tunnels for --graceful-shutdown-timeout (15 s)
// and our agent drains and keeps serving: every tunnel must end whole.
func sigtermMidTransfer(t *testing.T, dial churn.Dialer, target *churn.IntegrityTarget, first uint64, proc *proctest.Process, wait time.Duration) []churn.Outcome {
	var tunnels []churn.Tunnel
	for i := range 64 {
		tunnels = append(tunnels, churn.Tunnel{ID: first + uint64(i) + 1, Case: churn.DownSlow, Down: 1 << 20})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	base := target.Started()
	done := make(chan []churn.Outcome, 1)
	go func() { done <- churn.RunIntegrity(ctx, dial, target, tunnels, len(tunnels), wait) }()
	// The slow readers take about 256 ms per MiB: SIGTERM lands while
	// every tunnel still carries data, once all have reached the target
	// (or the run has ended without: that shows in its outcomes).
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for target.Started()-base < len(tunnels) {
		select {
		case out := <-done:
			return out
		case <-tick.C:
		}
	}
	require.NoError(t, proc.Signal(syscall.SIGTERM))
	return <-done
}

// agentReplacedMidTransfer replaces the pair's agent while 64 DownSlow
// tunnels of 1 MiB run through it, as a DaemonSet's rolling update does:
// a second agent connects, the first gets SIGTERM, and 64 more tunnels
// (requests of 32 KiB each way) are dialled meanwhile. Our agent drains
// on SIGTERM and keeps serving what it has, and our server sends new
// dials to the agent that is not draining: every tunnel must end whole.
func agentReplacedMidTransfer(t *testing.T, p pair, dial churn.Dialer, target *churn.IntegrityTarget, first uint64, wait time.Duration) []churn.Outcome {
	var slow, after []churn.Tunnel
	for i := range 64 {
		slow = append(slow, churn.Tunnel{ID: first + uint64(i) + 1, Case: churn.DownSlow, Down: 1 << 20})
		after = append(after, churn.Tunnel{ID: first + uint64(i) + 1001, Case: churn.Request, Up: 32 << 10, Down: 32 << 10})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	base := target.Started()
	done := make(chan []churn.Outcome, 1)
	go func() { done <- churn.RunIntegrity(ctx, dial, target, slow, len(slow), wait) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for target.Started()-base < len(slow) {
		select {
		case out := <-done:
			return out
		case <-tick.C:
		}
	}
	p.addAgent(t, "churn-2")
	require.NoError(t, p.agent.Signal(syscall.SIGTERM))
	more := churn.RunIntegrity(ctx, dial, target, after, 16, wait)
	return append(<-done, more...)
}

// openAtServer is the tunnels p's server holds, established or pending
// (-1 when its metrics cannot be read).
func openAtServer(p pair) float64 {
	m, err := proctest.Scrape(p.serverMetrics)
	if err != nil {
		return -1
	}
	return m.Sum("konnectivity_network_proxy_server_established_connections") + m.Sum("konnectivity_network_proxy_server_pending_backend_dials")
}

// report fails a held pairing unless every tunnel was delivered, and
// logs the first few losses of any pairing.
func report(t *testing.T, held bool, tally churn.Tally, all []churn.Outcome) {
	t.Log(tally)
	shown := 0
	lost := map[string]int{} // by case, and where the loss showed
	for _, o := range all {
		if o.Verdict == churn.Delivered {
			continue
		}
		if shown < 10 {
			t.Log(o)
			shown++
		}
		lost[fmt.Sprintf("%s %s, %s", o.Case, o.Verdict, lossAt(o))]++
	}
	if len(lost) > 0 {
		t.Logf("not delivered, by case: %v", lost)
	}
	if held {
		assert.Zero(t, tally.Silent, "silent losses in our pair")
		assert.Equal(t, tally.Tunnels, tally.Delivered, "tunnels not delivered in our pair")
	}
}

// lossAt says where a tunnel that was not delivered went wrong: the
// client saw an error, the target never learned that the tunnel ended
// (its header did not arrive, or no end came), or the bytes of one way
// were short or wrong.
func lossAt(o churn.Outcome) string {
	switch {
	case o.Err != nil:
		return "client error"
	case o.Up.Err != nil:
		return "target saw no clean end"
	case o.Up.Bytes != o.Tunnel.Up || o.Up.Bad >= 0:
		return "up short"
	}
	return "down short"
}

// integrityTable is the run's table in Markdown.
func integrityTable(rows []integrityRow) string {
	var b strings.Builder
	b.WriteString("| pairing | frontend | phase | tunnels | delivered | failed | silent | took |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d | %.1f s |\n", r.pairing, r.frontend, r.phase, r.Tunnels, r.Delivered, r.Failed, r.Silent, r.took.Seconds())
	}
	return b.String()
}
