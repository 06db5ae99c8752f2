package tunnelbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/chart"
	"github.com/servercount/servercount/test/upstream"
)

var (
	sideRuns  = flag.Int("tunnelbench.runs", 5, "side-by-side runs of BenchmarkUpstream")
	quietLoad = flag.Float64("tunnelbench.quiet-load", 1.5, "BenchmarkUpstream waits for the 1-minute load average to fall below this before it starts")
	quietWait = flag.Duration("tunnelbench.quiet-wait", 3*time.Minute, "how long BenchmarkUpstream waits for a quiet machine before it runs anyway, and says so")
	sideOut   = flag.String("tunnelbench.out", "", "also append BenchmarkUpstream's and BenchmarkUpstreamIdleTunnels' tables to this file (an absolute path)")
	sideChart = flag.String("tunnelbench.chart", "", "also write BenchmarkUpstream's PNG chart of the times to first byte to this file (an absolute path)")
	burners   = flag.Int("tunnelbench.burners", 0, "CPU burners (processes that spin, one core each) to run beside BenchmarkUpstream, for the tail under load; with any, it does not wait for a quiet machine")
)

// BenchmarkUpstream runs our binaries and upstream's (built from
// ../shared/upstream) side by side in one run, as processes with the same
// target, certificates and flags, in both frontend modes. Each of
// -tunnelbench.runs runs measures, per mode, dials new tunnels to
// first byte (direct, ours and upstream's taking turns, dials times) and
// downloads bulkSize once through each (direct, ours, upstream). It
// reports ours/upstream and each against a direct connection: the median
// over runs, with the range, and the load average beside each run; and
// the CPU each process spent per new tunnel and per GB, and the dial's
// floor. Run it with make bench-upstream; BENCH_PROFILE=dir also writes
// CPU profiles of our processes (downloads and new tunnels) and execution
// traces of every process, and adds the table of wake-ups and system
// calls per tunnel. The tables are written as soon as they are known, so
// that a failure in profiling still leaves the run's figures.
func BenchmarkUpstream(b *testing.B) {
	up := upstream.Require(b)
	if *burners > 0 {
		burn(b, *burners)
	} else {
		waitQuiet(b)
	}
	f := startFixture(b, *profileDir != "")
	f.startUpstream(b, up)
	f.echo = startEcho(b)
	var runs []sideRun
	for b.Loop() {
		for i := range *sideRuns {
			r := runSideBySide(b, f)
			b.Logf("run %d of %d, load %.2f", i+1, *sideRuns, r.load)
			runs = append(runs, r)
		}
	}
	table := sideTable(runs, up.Commit)
	b.Logf("\n%s", table)
	appendOut(b, table)
	if *sideChart != "" {
		if err := writeSideChart(*sideChart, runs, up.Commit); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"connect", "grpc"} {
		b.ReportMetric(medianOf(runs, func(r sideRun) float64 { return r.modes[mode].dialMedian.ratio() }), "ours/upstream-dial-median-"+mode)
		b.ReportMetric(medianOf(runs, func(r sideRun) float64 { return r.modes[mode].dialP99.ratio() }), "ours/upstream-dial-p99-"+mode)
		b.ReportMetric(medianOf(runs, func(r sideRun) float64 { return r.modes[mode].rate.ratio() }), "ours/upstream-MB/s-"+mode)
	}
	if *profileDir != "" {
		for _, p := range f.pairs {
			profile(b, p, func() { download(b, f, p.dial()) })
			record(b, p, "profile", "dials.pprof", func() { firstByte(b, f, p.dial()) })
			b.Logf("%s: CPU profiles during new tunnels in %s/%s-%s-{server,agent}.dials.pprof", p.mode, *profileDir, p.impl, p.name)
		}
		// Execution traces of new tunnels, ours and upstream's, to count
		// what each process does for one: its goroutines' wake-ups.
		traced := map[*pair]int{}
		all := slices.Concat(f.pairs, f.upstream)
		for _, p := range all {
			traced[p] = record(b, p, "trace", "trace", func() { firstByte(b, f, p.dial()) })
			b.Logf("%s %s: execution traces of about %d new tunnels in %s/%s-%s-{server,agent}.trace", p.impl, p.mode, traced[p], *profileDir, p.impl, p.name)
		}
		sched := schedTable(b, all, traced, *profileDir)
		b.Logf("\n%s", sched)
		appendOut(b, sched)
	}
}

// appendOut appends text, after a blank line, to -tunnelbench.out if it
// is set: the tables of every benchmark of a run, as soon as each is
// known (make bench-upstream removes the file first).
func appendOut(b *testing.B, text string) {
	b.Helper()
	if *sideOut == "" {
		return
	}
	f, err := os.OpenFile(*sideOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString(text + "\n")
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		b.Fatal(err)
	}
}

// startUpstream adds upstream's pairs to f.upstream.
func (f *fixture) startUpstream(b *testing.B, up upstream.Binaries) {
	b.Helper()
	f.upstream = f.startPairs(b, "upstream", up.Server, up.Agent)
}

// triple is one figure measured directly, through ours and through
// upstream's.
type triple struct{ direct, ours, upstream float64 }

// ratio is ours over upstream's.
func (t triple) ratio() float64 { return t.ours / t.upstream }

// modeRun is one run's figures of one frontend mode.
type modeRun struct {
	dialMedian, dialP99 triple // seconds to first byte
	rate                triple // MB/s
	// crossing is the median time, in seconds, of one crossing between
	// idle processes: half a loopback round trip to the echo peer, taken
	// in turns with the dials.
	crossing float64
	// dialCPU is the CPU seconds per new tunnel of each process (ours and
	// upstream's server and agent), over the dials: each is idle but for
	// its own.
	dialCPU map[string]float64
	// cpu is the CPU seconds per GB of each process: ours and upstream's
	// server and agent, and this process (the client and the target)
	// during each one's download.
	cpu map[string]float64
}

// sideRun is one run: its load average and each mode's figures.
type sideRun struct {
	load  float64
	modes map[string]modeRun
	// firstBytes are the times to first byte, in seconds, by mode and
	// path (direct, ours, upstream), for the chart.
	firstBytes map[string]map[string][]float64
}

func runSideBySide(b *testing.B, f *fixture) sideRun {
	b.Helper()
	r := sideRun{load: loadAverage(), modes: map[string]modeRun{}, firstBytes: map[string]map[string][]float64{}}
	for i, ours := range f.pairs {
		theirs := f.upstream[i]
		var direct, o, u, cross []time.Duration
		dialing := func(dial dialFunc) func() time.Duration {
			return func() time.Duration { return firstByte(b, f, dial) }
		}
		paths := []struct {
			measure func() time.Duration
			into    *[]time.Duration
		}{
			{dialing(dialDirect), &direct}, {dialing(ours.dial()), &o}, {dialing(theirs.dial()), &u},
			{func() time.Duration {
				d, err := crossing(f.echo)
				if err != nil {
					b.Fatal(err)
				}
				return d
			}, &cross},
		}
		cpu0 := processCPU(ours, theirs)
		for n := range dials {
			// Take turns, starting with another path each time, so that
			// no path always follows the same one.
			for k := range paths {
				p := paths[(n+k)%len(paths)]
				*p.into = append(*p.into, p.measure())
			}
		}
		r.firstBytes[ours.name] = map[string][]float64{"direct": seconds(direct), "ours": seconds(o), "upstream": seconds(u)}
		m := modeRun{
			dialMedian: triple{median(seconds(direct)), median(seconds(o)), median(seconds(u))},
			dialP99:    triple{percentile(seconds(direct), 0.99), percentile(seconds(o), 0.99), percentile(seconds(u), 0.99)},
			crossing:   median(seconds(cross)),
			cpu:        map[string]float64{},
			dialCPU:    map[string]float64{},
		}
		for k, v := range processCPU(ours, theirs) {
			m.dialCPU[k] = (v - cpu0[k]).Seconds() / dials
		}
		m.rate.direct = download(b, f, dialDirect)
		for _, p := range []*pair{ours, theirs} {
			s0, a0, c0 := cpuOrZero(p.serverPID), cpuOrZero(p.agentPID), cpuOrZero(os.Getpid())
			rate := download(b, f, p.dial())
			gb := float64(bulkSize) / 1e9
			m.cpu[p.impl+"-server"] = (cpuOrZero(p.serverPID) - s0).Seconds() / gb
			m.cpu[p.impl+"-agent"] = (cpuOrZero(p.agentPID) - a0).Seconds() / gb
			m.cpu[p.impl+"-client"] = (cpuOrZero(os.Getpid()) - c0).Seconds() / gb
			if p.impl == "ours" {
				m.rate.ours = rate
			} else {
				m.rate.upstream = rate
			}
		}
		r.modes[ours.name] = m
	}
	return r
}

// firstByte dials a new connection and returns the time to the first
// byte of a tiny response.
func firstByte(b *testing.B, f *fixture, dial dialFunc) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
	defer cancel()
	start := time.Now()
	c, err := dial(ctx, f.target)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	first, _, err := fetch(ctx, c, tinyPath, make([]byte, chunk))
	if err != nil {
		b.Fatal(err)
	}
	return first.Sub(start)
}

// download fetches bulkSize bytes over a new connection and returns MB/s.
func download(b *testing.B, f *fixture, dial dialFunc) float64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), opTimeout)
	defer cancel()
	c, err := dial(ctx, f.target)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, _, err := fetch(ctx, c, bulkPath, make([]byte, chunk)); err != nil {
		b.Fatal(err)
	}
	return bulkSize / time.Since(start).Seconds() / 1e6
}

// processCPU is the CPU time so far of each pair's server and agent, by
// impl-role.
func processCPU(pairs ...*pair) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, p := range pairs {
		m[p.impl+"-server"], m[p.impl+"-agent"] = cpuOrZero(p.serverPID), cpuOrZero(p.agentPID)
	}
	return m
}

// cpuOrZero is pid's CPU time, or 0 where /proc cannot tell.
func cpuOrZero(pid int) time.Duration {
	d, err := cpuTime(pid)
	if err != nil {
		return 0
	}
	return d
}

// loadAverage is the 1-minute load average, or -1 where /proc cannot tell.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// burn starts n CPU burners, processes that spin until the benchmark
// ends, as other jobs on a shared machine do: both implementations then
// compete with them for the same cores.
func burn(b *testing.B, n int) {
	b.Helper()
	for range n {
		proctest.Start(b, "/bin/sh", "-c", "while :; do :; done")
	}
	b.Logf("%d CPU burners running beside the benchmark", n)
}

// waitQuiet waits for the load average to fall below -tunnelbench.quiet-load,
// for at most -tunnelbench.quiet-wait, and says whether it did.
func waitQuiet(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(*quietWait)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		load := loadAverage()
		if load < 0 || load < *quietLoad {
			b.Logf("machine quiet: load %.2f", load)
			return
		}
		if time.Now().After(deadline) {
			b.Logf("machine NOT quiet after %v: load %.2f (wanted < %.2f); the figures below are under load", *quietWait, load, *quietLoad)
			return
		}
		select {
		case <-b.Context().Done():
			return
		case <-tick.C:
		}
	}
}

func medianOf(runs []sideRun, v func(sideRun) float64) float64 {
	vs := make([]float64, 0, len(runs))
	for _, r := range runs {
		vs = append(vs, v(r))
	}
	return median(vs)
}

func rangeOf(runs []sideRun, v func(sideRun) float64) (lo, hi float64) {
	vs := make([]float64, 0, len(runs))
	for _, r := range runs {
		vs = append(vs, v(r))
	}
	return slices.Min(vs), slices.Max(vs)
}

// sideTable is the side-by-side table in Markdown: medians over runs and,
// for ratios, the range.
func sideTable(runs []sideRun, commit string) string {
	var s strings.Builder
	loads := make([]string, 0, len(runs))
	for _, r := range runs {
		loads = append(loads, fmt.Sprintf("%.2f", r.load))
	}
	burning := ""
	if *burners > 0 {
		burning = fmt.Sprintf(", with %d CPU burners", *burners)
	}
	fmt.Fprintf(&s, "Side by side with upstream %s%s, %d runs (load at each: %s), medians over runs:\n\n", commit, burning, len(runs), strings.Join(loads, ", "))
	s.WriteString("| | direct | upstream | ours | ours / upstream [range] | upstream / direct | ours / direct |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	row := func(what, unit string, scale float64, get func(modeRun) triple, mode string) {
		pick := func(f func(triple) float64) float64 {
			return medianOf(runs, func(r sideRun) float64 { return f(get(r.modes[mode])) })
		}
		d, u, o := pick(func(t triple) float64 { return t.direct }), pick(func(t triple) float64 { return t.upstream }), pick(func(t triple) float64 { return t.ours })
		lo, hi := rangeOf(runs, func(r sideRun) float64 { return get(r.modes[mode]).ratio() })
		fmt.Fprintf(&s, "| %s | %.0f %s | %.0f %s | %.0f %s | %.2f [%.2f-%.2f] | %.2f | %.2f |\n",
			what, d*scale, unit, u*scale, unit, o*scale, unit, medianOf(runs, func(r sideRun) float64 { return get(r.modes[mode]).ratio() }), lo, hi, u/d, o/d)
	}
	for _, m := range []struct{ name, title string }{{"connect", "HTTP CONNECT"}, {"grpc", "gRPC frontend"}} {
		row("new tunnel to first byte, "+m.title+" (median)", "µs", 1e6, func(r modeRun) triple { return r.dialMedian }, m.name)
		row("same, p99", "µs", 1e6, func(r modeRun) triple { return r.dialP99 }, m.name)
		row("throughput, "+m.title, "MB/s", 1, func(r modeRun) triple { return r.rate }, m.name)
	}
	fmt.Fprintf(&s, "\nThe floor of a new tunnel: a direct connection's time to first byte plus the crossings between processes the protocol adds to it, each a wake-up of an idle process (one crossing: half a loopback round trip between two idle processes, taken in turns with the dials), medians over runs:\n\n")
	s.WriteString("| mode | one crossing | crossings | floor | upstream / floor | ours / floor | target (0.5 x upstream) / floor | CPU per tunnel, upstream's server + agent | ours |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, m := range []string{"connect", "grpc"} {
		get := func(v func(modeRun) float64) float64 {
			return medianOf(runs, func(r sideRun) float64 { return v(r.modes[m]) })
		}
		c := get(func(r modeRun) float64 { return r.crossing })
		floor := get(func(r modeRun) float64 { return r.dialMedian.direct + float64(crossings[m])*r.crossing })
		u, o := get(func(r modeRun) float64 { return r.dialMedian.upstream }), get(func(r modeRun) float64 { return r.dialMedian.ours })
		cpu := func(impl string) float64 {
			return get(func(r modeRun) float64 { return r.dialCPU[impl+"-server"] + r.dialCPU[impl+"-agent"] })
		}
		fmt.Fprintf(&s, "| %s | %.0f µs | %d | %.0f µs | %.2f | %.2f | %.2f | %.0f µs | %.0f µs |\n", m, c*1e6, crossings[m], floor*1e6, u/floor, o/floor, 0.5*u/floor, cpu("upstream")*1e6, cpu("ours")*1e6)
	}
	cores := runtime.NumCPU()
	fmt.Fprintf(&s, "\nCPU seconds per GB, medians over runs, and the rate at which the %d cores would be busy with the server, the agent and this process (the client and the target) together:\n\n", cores)
	s.WriteString("| mode | our server | our agent | client and target, ours | CPU-bound rate, ours | upstream's server | upstream's agent | client and target, upstream's | CPU-bound rate, upstream's |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, m := range []string{"connect", "grpc"} {
		c := func(k string) float64 { return medianOf(runs, func(r sideRun) float64 { return r.modes[m].cpu[k] }) }
		bound := func(impl string) float64 {
			return float64(cores) * 1e3 / (c(impl+"-server") + c(impl+"-agent") + c(impl+"-client"))
		}
		fmt.Fprintf(&s, "| %s | %.2f | %.2f | %.2f | %.0f MB/s | %.2f | %.2f | %.2f | %.0f MB/s |\n", m,
			c("ours-server"), c("ours-agent"), c("ours-client"), bound("ours"),
			c("upstream-server"), c("upstream-agent"), c("upstream-client"), bound("upstream"))
	}
	return s.String()
}

// writeSideChart draws the distribution of the times to first byte over
// every run, per frontend mode: direct, ours and upstream's.
func writeSideChart(path string, runs []sideRun, commit string) error {
	var panels []chart.Panel
	for _, m := range []struct{ name, title string }{{"connect", "HTTP CONNECT"}, {"grpc", "gRPC frontend"}} {
		pn := chart.Panel{
			Title:  fmt.Sprintf("new tunnel to first byte, %s", m.title),
			XLabel: "µs (log scale)", YLabel: "fraction of dials at or below", LogX: true,
		}
		for _, path := range []struct{ key, name string }{{"ours", "servercount"}, {"upstream", "upstream " + commit}, {"direct", "direct connection"}} {
			var all []float64
			for _, r := range runs {
				for _, v := range r.firstBytes[m.name][path.key] {
					all = append(all, v*1e6)
				}
			}
			pn.Series = append(pn.Series, chart.Series{Name: path.name, Points: chart.CDF(all)})
		}
		panels = append(panels, pn)
	}
	return chart.WritePNG(path, 5*vg.Inch, 4*vg.Inch, panels...)
}
