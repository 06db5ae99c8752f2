// Package proctest builds and runs programs as real processes on
// loopback, for tests that need what only a process has: its own signals,
// file descriptors, memory and exit code. The in-module tests run this
// module's binaries with it, and the e2e harness the control plane too.
//
// Every process runs in its own process group, with SIGKILL as its parent
// death signal on Linux, so that neither it nor its children outlive the
// test binary, even one that is killed.
package proctest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/explain"
)

var (
	buildMu  sync.Mutex
	builtDir string
	built    = map[string]string{}
)

// Build compiles the main package at pkg, a path relative to the module
// root such as "cmd/proxy-agent", once per test binary, and returns the
// executable's path.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	root, err := moduleRoot()
	require.NoError(tb, err)
	if builtDir == "" {
		// Not tb.TempDir: the binary outlives the test that built it.
		builtDir, err = os.MkdirTemp("", "proctest")
		require.NoError(tb, err)
	}
	out := filepath.Join(builtDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	require.NoError(tb, err, "go build %s: %s", pkg, b)
	built[pkg] = out
	return out
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("proctest: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Status returns the HTTP status of a GET of url, or 0 if there is no
// answer within 2s.
func Status(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// RequireStatus waits until a GET of url answers code, and fails tb
// with msgAndArgs if it has not within the wait.
func RequireStatus(tb testing.TB, url string, code int, within time.Duration, msgAndArgs ...any) {
	tb.Helper()
	require.Eventually(tb, func() bool { return Status(url) == code }, within, 20*time.Millisecond, msgAndArgs...)
}

// RequireReturns waits for the error of a Run that was told to stop, sent
// on done, and fails tb unless it is nil and comes within the wait.
func RequireReturns(tb testing.TB, done <-chan error, within time.Duration) {
	tb.Helper()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case err := <-done:
		require.NoError(tb, err)
	case <-t.C:
		tb.Fatalf("Run did not return within %v of being told to stop", within)
	}
}

// StatusKiB returns the field of /proc/<pid>/status named field, in KiB:
// VmRSS, for one, is RssAnon (the process's own memory) plus RssFile
// (pages of the binary and other mapped files, which the kernel can drop
// and read again) plus RssShmem.
func StatusKiB(pid int, field string) (int, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// Metrics is a scrape of a /metrics page.
type Metrics map[string][]Sample

// Sample is one series of a scrape.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Scrape reads the Prometheus text exposition at url.
func Scrape(url string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// No keep-alive: a connection kept idle for the next scrape would
	// outlive the test that scraped, in goleak's eyes, whenever the
	// process is killed before the next one.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return m, nil
}

// Parse reads a Prometheus text exposition with the reader the probe's
// explain uses, into samples.
func Parse(r io.Reader) (Metrics, error) {
	fams, err := explain.Parse(r)
	if err != nil {
		return nil, err
	}
	m := Metrics{}
	for name, mf := range fams {
		for _, metric := range mf.GetMetric() {
			s := Sample{Labels: map[string]string{}}
			for _, l := range metric.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case metric.GetGauge() != nil:
				s.Value = metric.GetGauge().GetValue()
			case metric.GetCounter() != nil:
				s.Value = metric.GetCounter().GetValue()
			case metric.GetUntyped() != nil:
				s.Value = metric.GetUntyped().GetValue()
			case metric.GetHistogram() != nil:
				// As exposed: name_count and name_sum (buckets are not
				// needed by any test).
				h := metric.GetHistogram()
				m[name+"_count"] = append(m[name+"_count"], Sample{Labels: s.Labels, Value: float64(h.GetSampleCount())})
				m[name+"_sum"] = append(m[name+"_sum"], Sample{Labels: s.Labels, Value: h.GetSampleSum()})
				continue
			default:
				continue
			}
			m[name] = append(m[name], s)
		}
	}
	return m, nil
}

// Value returns the value of the series name whose labels include
// labels (name, value pairs), and whether there is one.
func (m Metrics) Value(name string, labels ...string) (float64, bool) {
	for _, s := range m[name] {
		if s.has(labels) {
			return s.Value, true
		}
	}
	return 0, false
}

// Sum returns the sum of every series named name whose labels include
// labels (name, value pairs): e.g. apiserver_request_total of one
// resource, over every code. It is 0 when there is none.
func (m Metrics) Sum(name string, labels ...string) float64 {
	var v float64
	for _, s := range m[name] {
		if s.has(labels) {
			v += s.Value
		}
	}
	return v
}

func (s Sample) has(labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if s.Labels[labels[i]] != labels[i+1] {
			return false
		}
	}
	return true
}

// String lists the series whose names start with prefix, for messages.
func (m Metrics) String(prefix string) string {
	var b strings.Builder
	for name, ss := range m {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, s := range ss {
			fmt.Fprintf(&b, "%s%v %g\n", name, s.Labels, s.Value)
		}
	}
	return b.String()
}
