package tunnelbench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

var (
	profileDir = flag.String("tunnelbench.profile", "",
		"write CPU profiles of each proxy-server and proxy-agent into this directory, taken during extra tunnel downloads after the throughput rounds "+
			"(go test runs in the package's directory: give an absolute path)")
	profileSeconds = flag.Int("tunnelbench.profile-seconds", 8, "length of each CPU profile, in seconds")
	extraArgs      = flag.String("tunnelbench.args", "",
		"more flags, space-separated, for both binaries: e.g. --tunnel-window=-1 to measure without flow control")
)

const (
	// rounds is the number of throughput rounds: in each, a direct
	// download, then one through each tunnel, each after a direct one.
	rounds = 5
	// dials is the number of new tunnels per mode in the first-byte
	// benchmark, each after a new direct connection.
	dials = 200
	// chunk is the size of each read of a response body.
	chunk = 64 << 10
)

// BenchmarkTunnel measures tunnels through the proxy-server and
// proxy-agent binaries, in both frontend modes, against direct
// connections to the same target in the same run. Run it with
// -benchtime 1x (make bench-tunnel): one iteration is the whole
// measurement.
func BenchmarkTunnel(b *testing.B) {
	f := startFixture(b, *profileDir != "")
	b.Run("throughput", func(b *testing.B) { benchThroughput(b, f) })
	b.Run("first-byte", func(b *testing.B) { benchFirstByte(b, f) })
}

// benchThroughput downloads bulkSize bytes over a connection opened
// beforehand, alternating direct and tunnel downloads, rounds times. It
// reports the median of each round's tunnel rate over the direct rate just
// before it (x-direct-<mode>), the median rates, and the CPU time the
// server and the agent used per GB through them (Linux only). The CPU
// figures vary less with the machine's load than the rates do, but still
// by 10-20% from run to run on a shared machine: compare two builds over
// several alternating runs.
//
// With -tunnelbench.profile, it then profiles each server and agent
// during more tunnel downloads.
func benchThroughput(b *testing.B, f *fixture) {
	download := func(dial dialFunc) float64 { return download(b, f, dial) }
	// Warm up each path: the first tunnel starts pools and grows windows.
	download(dialDirect)
	for _, p := range f.pairs {
		download(p.dial())
	}

	ratios := map[string][]float64{}
	rates := map[string][]float64{}
	// CPU time of each server and agent over its tunnel downloads: it
	// depends less than the rates on what else the machine runs.
	serverCPU := map[string]time.Duration{}
	agentCPU := map[string]time.Duration{}
	// Without /proc (not Linux) there are no CPU figures.
	_, cpuErr := cpuTime(os.Getpid())
	if cpuErr != nil {
		b.Logf("no CPU time figures: %v", cpuErr)
	}
	cpu := func(pid int) time.Duration {
		b.Helper()
		if cpuErr != nil {
			return 0
		}
		d, err := cpuTime(pid)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	for b.Loop() {
		for range rounds {
			for _, p := range f.pairs {
				direct := download(dialDirect)
				s0, a0 := cpu(p.serverPID), cpu(p.agentPID)
				tunnel := download(p.dial())
				serverCPU[p.name] += cpu(p.serverPID) - s0
				agentCPU[p.name] += cpu(p.agentPID) - a0
				rates["direct"] = append(rates["direct"], direct)
				rates[p.name] = append(rates[p.name], tunnel)
				ratios[p.name] = append(ratios[p.name], tunnel/direct)
			}
		}
	}
	for _, p := range f.pairs {
		b.ReportMetric(median(ratios[p.name]), "x-direct-"+p.name)
		b.ReportMetric(median(rates[p.name]), "MB/s-"+p.name)
		if cpuErr == nil {
			gb := float64(len(rates[p.name])) * bulkSize / 1e9
			b.ReportMetric(serverCPU[p.name].Seconds()/gb, "server-cpu-s/GB-"+p.name)
			b.ReportMetric(agentCPU[p.name].Seconds()/gb, "agent-cpu-s/GB-"+p.name)
		}
		b.Logf("%s: x-direct by round %.3f, MB/s by round %.0f", p.mode, ratios[p.name], rates[p.name])
	}
	b.ReportMetric(median(rates["direct"]), "MB/s-direct")

	if *profileDir != "" {
		for _, p := range f.pairs {
			profile(b, p, func() { download(p.dial()) })
		}
	}
}

// benchFirstByte opens dials new tunnels per mode, each fetching a tiny
// response, each after a new direct TCP connection that fetches the same,
// and reports the median and the 99th percentile of the time from the
// dial to the first byte of the response, as ratios to the direct
// connections' (x-direct-median-<mode>, x-direct-p99-<mode>).
func benchFirstByte(b *testing.B, f *fixture) {
	firstByte := func(dial dialFunc) time.Duration { return firstByte(b, f, dial) }
	for _, p := range f.pairs {
		firstByte(dialDirect)
		firstByte(p.dial())
	}

	direct := map[string][]time.Duration{}
	tunnel := map[string][]time.Duration{}
	for b.Loop() {
		for range dials {
			for _, p := range f.pairs {
				direct[p.name] = append(direct[p.name], firstByte(dialDirect))
				tunnel[p.name] = append(tunnel[p.name], firstByte(p.dial()))
			}
		}
	}
	for _, p := range f.pairs {
		d, t := seconds(direct[p.name]), seconds(tunnel[p.name])
		b.ReportMetric(median(t)/median(d), "x-direct-median-"+p.name)
		b.ReportMetric(percentile(t, 0.99)/percentile(d, 0.99), "x-direct-p99-"+p.name)
		b.ReportMetric(median(t)*1e6, "us-median-"+p.name)
		b.ReportMetric(percentile(t, 0.99)*1e6, "us-p99-"+p.name)
		b.Logf("%s: median %v, p99 %v; direct: median %v, p99 %v", p.mode,
			time.Duration(median(t)*1e9), time.Duration(percentile(t, 0.99)*1e9),
			time.Duration(median(d)*1e9), time.Duration(percentile(d, 0.99)*1e9))
	}
}

// profile takes a CPU profile of p's server and agent at once, running
// load until both are written to profileDir.
func profile(b *testing.B, p *pair, load func()) {
	b.Helper()
	record(b, p, "profile", "pprof", load)
	b.Logf("%s: CPU profiles in %s/%s-%s-{server,agent}.pprof", p.mode, *profileDir, p.impl, p.name)
}

// record fetches /debug/pprof/<kind> of -tunnelbench.profile-seconds from
// p's server and agent at once into profileDir, <impl>-<mode>-<role>.<ext>,
// running load until both are written. It returns how many times load
// ran.
func record(b *testing.B, p *pair, kind, ext string, load func()) int {
	b.Helper()
	if err := os.MkdirAll(*profileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	secs := *profileSeconds
	ctx, cancel := context.WithTimeout(b.Context(), time.Duration(secs)*time.Second+opTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, role := range []struct{ name, url string }{{"server", p.serverAdmin}, {"agent", p.agentAdmin}} {
		file := filepath.Join(*profileDir, fmt.Sprintf("%s-%s-%s.%s", p.impl, p.name, role.name, ext))
		wg.Go(func() {
			errs[i] = fetchProfile(ctx, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", role.url, kind, secs), file)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for n := 0; ; n++ {
		select {
		case <-done:
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			return n
		default:
			load()
		}
	}
}

// fetchProfile GETs a pprof profile at url into file.
func fetchProfile(ctx context.Context, url, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	rsp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("get profile %s: %w", url, err)
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		return fmt.Errorf("get profile %s: %s", url, rsp.Status)
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, rsp.Body); err != nil {
		_ = out.Close()
		return fmt.Errorf("read profile %s: %w", url, err)
	}
	return out.Close()
}

func seconds(ds []time.Duration) []float64 {
	s := make([]float64, len(ds))
	for i, d := range ds {
		s[i] = d.Seconds()
	}
	return s
}

func median(v []float64) float64 { return percentile(v, 0.5) }

// percentile returns the smallest value of v that at least q of v's
// values are at or below (nearest rank).
func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	i := max(int(math.Ceil(q*float64(len(s))))-1, 0)
	return s[i]
}
