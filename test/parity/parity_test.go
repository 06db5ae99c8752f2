// Package parity is the behaviour-parity suite: it drives the
// same scenarios through upstream's binaries and through ours and
// compares what an operator observes: flags and their defaults, the
// environment, the frontend socket, health paths, metrics after the same
// traffic, signals. Where we differ on purpose, the difference is a row
// of the table in docs/differences.md, which the suite
// reads: a difference that is not there fails it.
//
// It runs with `make parity` (go test ./test/parity -parity), with
// upstream's binaries built once from ../shared/upstream.
package parity

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/upstream"
)

var run = flag.Bool("parity", false, "run the parity suite against upstream's binaries (make parity)")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// side is one implementation's proxy-server and proxy-agent.
type side struct {
	name          string // "upstream" or "ours"
	server, agent string
}

// sides returns upstream's binaries and ours, or skips t.
func sides(t *testing.T) (up, ours side) {
	t.Helper()
	if !*run {
		t.Skip("the parity suite runs upstream's binaries: make parity (go test ./test/parity -parity)")
	}
	b := upstream.Require(t)
	up = side{"upstream", b.Server, b.Agent}
	// Other builds of ours, e.g. an older commit's, to show what the
	// suite finds in them.
	if dir := os.Getenv("SERVERCOUNT_PARITY_OURS"); dir != "" {
		return up, side{"ours", filepath.Join(dir, "proxy-server"), filepath.Join(dir, "proxy-agent")}
	}
	return up, side{"ours", proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")}
}

// differences are the keys of the table of deliberate differences from
// upstream in docs/differences.md: the first column, in backquotes.
func differences(t *testing.T) map[string]bool {
	t.Helper()
	keys := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(doc(t, "differences.md"), -1) {
		keys[m[1]] = true
	}
	if len(keys) == 0 {
		t.Fatal("docs/differences.md has no table of differences from upstream")
	}
	return keys
}

// doc is the text of docs/name.
func doc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// differ reports a difference between upstream and ours under key: fine
// when docs/differences.md lists key, a failure otherwise.
func differ(t *testing.T, known map[string]bool, key, format string, args ...any) {
	t.Helper()
	if known[key] {
		t.Logf("known difference %q: "+format, append([]any{key}, args...)...)
		return
	}
	t.Errorf("difference not in docs/differences.md (key `%s`): "+format, append([]any{key}, args...)...)
}
