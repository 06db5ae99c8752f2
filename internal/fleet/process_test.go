package fleet

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/pkg/agent"
)

// BenchmarkAgentProcess runs one proxy-agent binary, as a process, against
// the fleet's 3 servers through DNS in resolved mode, with TLS and a
// token, and reports its resident memory (VmRSS) and goroutines once it
// holds the 3 servers and again after idling for a while.
func BenchmarkAgentProcess(b *testing.B) {
	bin := proctest.Build(b, "cmd/proxy-agent")
	f := New(b, Config{Agents: 1, Mode: agent.DialResolved})
	dir := b.TempDir()
	pair, err := f.env.CA.Client("agent-process")
	require.NoError(b, err)
	cert, key, err := pair.WriteFiles(dir, "agent")
	require.NoError(b, err)
	ca, err := f.env.CA.WriteFile(dir, "ca")
	require.NoError(b, err)
	token := filepath.Join(dir, "token")
	require.NoError(b, os.WriteFile(token, []byte(tokenPrefix+"agent-process"), 0o600))
	host, port, err := net.SplitHostPort(f.lb.Addr())
	require.NoError(b, err)
	ports := proctest.FreePorts(b, 2)

	p := proctest.Start(b, bin,
		"--agent-id=agent-process",
		"--proxy-server-host="+host, "--proxy-server-port="+port,
		"--ca-cert="+ca, "--agent-cert="+cert, "--agent-key="+key,
		"--service-account-token-path="+token,
		"--server-count-dns="+SRVName, "--server-count-dns-server="+f.dns.Addr(),
		"--server-dial-mode=resolved",
		"--health-server-host=127.0.0.1", "--health-server-port="+strconv.Itoa(ports[0]),
		"--admin-bind-address=127.0.0.1", "--admin-server-port="+strconv.Itoa(ports[1]),
	)
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	if _, err := f.WaitServers(ctx, f.Servers(), 1); err != nil {
		b.Fatalf("agent process: %v\n%s", err, p.Output())
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	report := func(when string) {
		rss, err := vmRSS(p.Process.Pid)
		require.NoError(b, err)
		b.ReportMetric(float64(rss)/1024, "rss-MiB-"+when)
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

// vmRSS returns the resident set of process pid in KiB, from
// /proc/<pid>/status.
func vmRSS(pid int) (int, error) {
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
