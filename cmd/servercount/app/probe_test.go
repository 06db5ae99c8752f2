package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/nettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const svc = "proxy.kube-system.svc.cluster.local."

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = app.Run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func headlessServer(t *testing.T, ips ...string) *dnstest.Server {
	t.Helper()
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, ips...)...)
	return srv
}

func TestRunPrintsDigStyle(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.3", "10.0.0.1", "10.0.0.2")
	code, out, errOut := run(t, "@"+srv.Addr(), "_agent._tcp."+svc)
	require.Equal(t, app.ExitOK, code, errOut)
	assert.Empty(t, errOut)
	for _, want := range []string{
		";; QUESTION SECTION:\n;_agent._tcp." + svc + "\tIN\tSRV\n",
		";; ANSWER SECTION:\n",
		";; ADDITIONAL SECTION:\n",
		";; COUNT: 3, outcome: records, rcode: NOERROR, transport: udp, truncated: no, min TTL: 30s, query time: ",
		", server: " + srv.Addr() + "\n",
	} {
		assert.Contains(t, out, want)
	}
	// Records sorted by target.
	i1, i2, i3 := strings.Index(out, "10-0-0-1."), strings.Index(out, "10-0-0-2."), strings.Index(out, "10-0-0-3.")
	assert.True(t, i1 < i2 && i2 < i3, out)
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.1", "10.0.0.2", "10.0.0.3")
	failing := dnstest.NewServer(t)
	failing.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	// Nothing listens on down's port.
	downPort, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	require.NoError(t, err)
	down := net.JoinHostPort("127.0.0.1", strconv.Itoa(downPort))

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "records", args: []string{"@" + srv.Addr(), svc}, wantCode: app.ExitOK, wantStdout: ";; COUNT: 3,"},
		{name: "type after name", args: []string{"@" + srv.Addr(), svc, "A"}, wantCode: app.ExitOK, wantStdout: "\tIN\tA\n\n;; ANSWER"},
		{name: "short", args: []string{"--short", "@" + srv.Addr(), svc}, wantCode: app.ExitOK, wantStdout: "3\n"},
		{name: "tcp", args: []string{"@" + srv.Addr(), "--tcp", svc}, wantCode: app.ExitOK, wantStdout: "transport: tcp,"},
		{name: "nxdomain", args: []string{"@" + srv.Addr(), "gone." + svc}, wantCode: app.ExitZero, wantStdout: "outcome: nxdomain, rcode: NXDOMAIN"},
		{name: "nodata", args: []string{"@" + srv.Addr(), "--type", "srv", svc}, wantCode: app.ExitZero, wantStdout: "outcome: nodata, rcode: NOERROR"},
		{name: "wrong port name explained", args: []string{"@" + srv.Addr(), "_nope._tcp." + svc}, wantCode: app.ExitZero,
			wantStdout: ";; HINT: Kubernetes answers NXDOMAIN for an SRV name when the Service has no port of that name"},
		{name: "servfail", args: []string{"@" + failing.Addr(), "--timeout", "1s", svc}, wantCode: app.ExitError,
			wantStderr: "servercount: count servers at " + svc + ": server answered SERVFAIL from " + failing.Addr() + " after 3 attempts (the nameserver could not resolve the name; check its logs and upstreams)\n"},
		{name: "server down", args: []string{"@" + down, "--timeout", "1s", svc}, wantCode: app.ExitError, wantStderr: "servercount: count servers at " + svc + ": "},
		{name: "no name", args: []string{"@" + srv.Addr()}, wantCode: app.ExitUsage, wantStderr: "servercount: missing NAME: give the DNS name to count"},
		{name: "unknown type flag", args: []string{"--type", "mx", svc}, wantCode: app.ExitUsage, wantStderr: `servercount: invalid --type "mx": use one of auto, srv, a, aaaa, ip` + "\n"},
		{name: "unknown type argument", args: []string{svc, "MX"}, wantCode: app.ExitUsage, wantStderr: `unexpected argument "MX" after NAME`},
		{name: "unknown flag", args: []string{"--nope", svc}, wantCode: app.ExitUsage, wantStderr: "servercount: unknown flag: --nope (see --help)\n"},
		{name: "invalid name", args: []string{"@" + srv.Addr(), "a..b"}, wantCode: app.ExitUsage, wantStderr: `servercount: invalid name "a..b": not a DNS name`},
		{name: "invalid server", args: []string{"@10.0.0.1:dns", svc}, wantCode: app.ExitUsage, wantStderr: `servercount: invalid nameserver "10.0.0.1:dns"`},
		{name: "short and json", args: []string{"--short", "--json", svc}, wantCode: app.ExitUsage, wantStderr: "--short and --json exclude each other"},
		{name: "help", args: []string{"--help"}, wantCode: app.ExitOK, wantStderr: "Usage: servercount [@server[:port]] [flags] NAME [TYPE]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := run(t, tc.args...)
			assert.Equal(t, tc.wantCode, code, "stdout %q stderr %q", out, errOut)
			if tc.wantStdout != "" {
				assert.Contains(t, out, tc.wantStdout)
			}
			if tc.wantStderr != "" {
				assert.Contains(t, errOut, tc.wantStderr)
			}
			if tc.wantCode != app.ExitOK || tc.name == "help" {
				assert.NotContains(t, errOut, "goroutine ", "no stack trace")
			}
			if tc.wantCode == app.ExitUsage || tc.wantCode == app.ExitError {
				assert.Equal(t, 1, strings.Count(errOut, "servercount: "), "one error line: %q", errOut)
			}
		})
	}
}

func TestRunServerDownExitsWithinTimeout(t *testing.T) {
	t.Parallel()
	srv := dnstest.NewServer(t)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultDrop})
	start := time.Now()
	code, _, errOut := run(t, "@"+srv.Addr(), "--timeout", "300ms", svc)
	assert.Equal(t, app.ExitError, code)
	assert.Contains(t, errOut, "timed out")
	// Not a timing assertion on speed: a bound that proves --timeout is
	// honoured rather than the default 5s.
	assert.Less(t, time.Since(start), 3*time.Second)
}

// --timeout is per attempt, as dig's +timeout, and an attempt that timed
// out keeps listening: a nameserver that answers every query in 3s is
// counted with --timeout 2s, by the first query's late answer while the
// second attempt waits.
func TestRunLateAnswerCounts(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.1", "10.0.0.2")
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultSlow, Delay: 3 * time.Second})
	code, out, errOut := run(t, "@"+srv.Addr(), "--timeout", "2s", "--attempts", "2", "--short", "_agent._tcp."+svc)
	require.Equal(t, app.ExitOK, code, errOut)
	assert.Equal(t, "2\n", out)
	assert.Equal(t, 2, srv.Queries(""), "the second attempt was sent")
}

func TestRunVersion(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "--version")
	require.Equal(t, app.ExitOK, code, errOut)
	assert.Regexp(t, `^servercount \S+ \(commit \S+, go\S+, \w+/\w+\)\n$`, out)
}

func TestRunJSON(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.1", "10.0.0.2")
	code, out, _ := run(t, "--json", "@"+srv.Addr(), "_agent._tcp."+svc)
	require.Equal(t, app.ExitOK, code)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, float64(2), got["count"])
	assert.Equal(t, "srv", got["type"])
	assert.Equal(t, "records", got["outcome"])
	assert.Equal(t, "NOERROR", got["rcode"])
	assert.Equal(t, "udp", got["transport"])
	assert.Equal(t, srv.Addr(), got["server"])
	assert.Len(t, got["answer"], 2)

	failing := dnstest.NewServer(t)
	failing.SetFault(dnstest.Fault{Kind: dnstest.FaultRefused})
	code, out, _ = run(t, "--json", "@"+failing.Addr(), svc)
	require.Equal(t, app.ExitError, code)
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Nil(t, got["count"], "an unknown count is null, not 0")
	assert.Equal(t, "refused", got["errorKind"])
}

func TestRunSearchesResolvConf(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.1")
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(resolv, []byte("search kube-system.svc.cluster.local\noptions ndots:5\n"), 0o644))
	code, out, errOut := run(t, "--resolv-conf", resolv, "--short", "@"+srv.Addr(), "proxy")
	require.Equal(t, app.ExitOK, code, errOut)
	assert.Equal(t, "1\n", out)
}

func TestRunWatchPrintsChanges(t *testing.T) {
	t.Parallel()
	srv := headlessServer(t, "10.0.0.1")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- app.Run(ctx, []string{"--watch", "--interval", "5ms", "@" + srv.Addr(), svc}, pw, io.Discard)
		pw.Close()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			require.True(t, ok, "a watch line")
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no watch line within 10s")
			return ""
		}
	}
	assert.Contains(t, next(), " count=1 outcome=records")
	srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2", "10.0.0.3")...)
	assert.Contains(t, next(), " count=3 ")
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	assert.Contains(t, next(), " count=unknown error=")
	srv.ClearFault()
	l := next()
	assert.Contains(t, l, " count=3 ")
	_, err := time.Parse(time.RFC3339Nano, strings.Fields(l)[0])
	assert.NoError(t, err, "lines start with a timestamp")
	cancel()
	go func() {
		for range lines { // drain until Run returns and the pipe closes
		}
	}()
	assert.Equal(t, app.ExitOK, <-done)
}
