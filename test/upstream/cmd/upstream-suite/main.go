// Command upstream-suite runs upstream's own integration suite (the
// ./tests package of apiserver-network-proxy, whose proxy-servers are
// upstream's, in process) against our proxy-agent, given with
// -agent-path, and lists every test with its result.
//
// The suite runs in a network namespace of its own: loopback, and a route
// that takes upstream's blackhole address (198.18.0.254, in the
// benchmarking range 198.18.0.0/15 of RFC 2544) into a void, so that its
// dial there hangs as the suite expects and no packet leaves the machine;
// its names are looked up in a DNS server of the runner's that knows none.
// Its routes are printed first.
//
// Expected: every test passes but those of knownFailures, which fail
// here with upstream's own agent too. A test that fails on one of the
// suite's own known timing races (raceProne) is run once more, alone,
// and the rerun is logged. The exit status is 0 when the results are the
// expected ones, 1 otherwise, and 3 (with one line saying how to get it)
// when upstream's source is not available.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/servercount/servercount/internal/netnstest"
	"github.com/servercount/servercount/test/upstream"
)

// knownFailures fail with upstream's agent as with ours, for a reason
// that is not the agent's: none today. (TestProxyDial_AgentTimeout_GRPC
// was one while the suite ran on the machine's own network, where a
// connect to its blackhole address succeeded.)
var knownFailures = map[string]string{}

// netnsMarker marks the runner re-executed in its own network namespace.
const netnsMarker = "SERVERCOUNT_UPSTREAM_SUITE_NETNS"

// blackholeRange holds the suite's blackhole address, 198.18.0.254.
const blackholeRange = "198.18.0.0/15"

// raceProne are tests that race a cancelled context against a response
// and can fail under load with either agent (upstream's README for this
// archive says so): one rerun, alone.
var raceProne = []string{"TestProxyHandle_TunnelContextCancelled_GRPC"}

func main() {
	agentPath := flag.String("agent-path", "", "the proxy-agent binary to test (required)")
	flag.Parse()
	if *agentPath == "" {
		fmt.Fprintln(os.Stderr, "upstream-suite: -agent-path is required")
		os.Exit(2)
	}
	agent, err := filepath.Abs(*agentPath)
	if err != nil {
		fail(err)
	}
	if !netnstest.Inside(netnsMarker) {
		code, err := netnstest.Reexec(netnsMarker)
		if err != nil {
			fail(err)
		}
		os.Exit(code)
	}
	if err := netnstest.Up(netnsMarker); err != nil {
		fail(err)
	}
	if err := netnstest.Void(netnsMarker, blackholeRange); err != nil {
		fail(err)
	}
	// TestFailedDNSLookupProxy_HTTPCONN wants "no such host" for a name
	// that does not exist.
	if err := netnstest.NoNames(netnsMarker); err != nil {
		fail(err)
	}
	routes, err := netnstest.Routes()
	if err != nil {
		fail(err)
	}
	fmt.Printf("upstream-suite: running in a network namespace of its own, %s into a void; its routes:\n%s", blackholeRange, routes)
	wd, err := os.Getwd()
	if err != nil {
		fail(err)
	}
	b, err := upstream.Find(context.Background(), wd)
	if errors.Is(err, upstream.ErrUnavailable) {
		fmt.Fprintln(os.Stderr, "upstream-suite: skipped:", err)
		os.Exit(3)
	}
	if err != nil {
		fail(err)
	}
	if b.Source == "" {
		fmt.Fprintf(os.Stderr, "upstream-suite: skipped: upstream's binaries come from $%s; set $%s to its source to run its suite\n", upstream.EnvBin, upstream.EnvSource)
		os.Exit(3)
	}

	results, err := runSuite(b.Source, agent, "")
	if err != nil {
		fail(err)
	}
	for _, name := range raceProne {
		if results[name] == "fail" {
			fmt.Printf("upstream-suite: %s failed; it races a cancelled context against the response (a known race of the suite's own): rerunning it once, alone\n", name)
			again, err := runSuite(b.Source, agent, "^"+name+"$")
			if err != nil {
				fail(err)
			}
			results[name] = again[name]
			fmt.Printf("upstream-suite: rerun of %s: %s\n", name, again[name])
		}
	}

	names := slices.Sorted(func(yield func(string) bool) {
		for n := range results {
			if !yield(n) {
				return
			}
		}
	})
	bad, passed := 0, 0
	for _, name := range names {
		res := results[name]
		note := ""
		switch why, known := knownFailures[name]; {
		case res == "pass" && known:
			note = "  (expected to fail here: it passes now; take it out of knownFailures)"
			bad++
		case res == "pass":
			passed++
		case known:
			note = "  (known: " + why + ")"
		default:
			note = "  (UNEXPECTED)"
			bad++
		}
		fmt.Printf("%-60s %s%s\n", name, res, note)
	}
	fmt.Printf("upstream-suite: %d of %d passed against %s\n", passed, len(names), agent)
	if bad > 0 || len(names) == 0 {
		os.Exit(1)
	}
}

// runSuite runs upstream's ./tests with -race against agent, only the
// tests that run matches when it is not empty, and returns each
// top-level test's result: pass, fail or skip.
func runSuite(src, agent, run string) (map[string]string, error) {
	args := []string{"test", "-race", "-count=1", "-json", "./tests", "-agent-path=" + agent}
	if run != "" {
		args = append(args, "-run", run)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=vendor", "GOWORK=off")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	results := map[string]string{}
	var output strings.Builder
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Action, Test, Output string
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		if ev.Action == "output" {
			output.WriteString(ev.Output)
		}
		if ev.Test == "" || strings.Contains(ev.Test, "/") {
			continue
		}
		switch ev.Action {
		case "pass", "fail", "skip":
			results[ev.Test] = ev.Action
		}
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil && len(results) == 0 {
		return nil, fmt.Errorf("go test ./tests in %s: %w\n%s", src, err, output.String())
	}
	for name, res := range results {
		if res == "fail" {
			fmt.Printf("upstream-suite: output of the run with the failure of %s:\n%s\n", name, tail(output.String(), 200))
			break
		}
	}
	return results, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "upstream-suite:", err)
	os.Exit(1)
}
