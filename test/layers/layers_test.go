// Package layers holds the test of the import rules that
// docs/architecture.md states: which layer may import which.
package layers

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/servercount/servercount/"

// goList runs go list with args and returns the project packages it
// prints, module prefix cut.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	var own []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, module) {
			own = append(own, strings.TrimPrefix(p, module))
		}
	}
	return own
}

// deps returns the project packages that pkgs link (their non-test
// imports, transitively).
func deps(t *testing.T, pkgs ...string) []string {
	return goList(t, append([]string{"-deps", "-f", "{{.ImportPath}}"}, pkgs...)...)
}

// imports returns the project packages that pkg imports directly, outside
// its tests.
func imports(t *testing.T, pkg string) []string {
	return goList(t, "-f", `{{join .Imports "\n"}}`, module+pkg)
}

// The rules of docs/architecture.md's import table.
func TestImportRules(t *testing.T) {
	// The library: pkg/ imports pkg/, and the cores the internal helpers
	// they share; never a binary, a kit or the other core.
	shared := []string{"internal/flow", "internal/metric", "internal/ondemand", "internal/outage"}
	cores := []string{"pkg/agent", "pkg/server"}
	for _, p := range []string{"pkg/clock", "pkg/wire", "pkg/servercounter", "pkg/lease", "pkg/agent", "pkg/server"} {
		core := slices.Contains(cores, p)
		for _, imp := range imports(t, p) {
			switch {
			case core && slices.Contains(cores, imp):
				t.Errorf("%s imports %s: the two cores share only pkg/ and the helpers", p, imp)
			case strings.HasPrefix(imp, "pkg/"), core && slices.Contains(shared, imp):
			default:
				t.Errorf("%s imports %s: see docs/architecture.md's import table", p, imp)
			}
		}
	}
	// Each binary links the core it is, not the other.
	for _, c := range []struct{ cmd, notCore string }{
		{"cmd/servercount", "pkg/agent"}, {"cmd/servercount", "pkg/server"},
		{"cmd/proxy-server", "pkg/agent"}, {"cmd/proxy-agent", "pkg/server"},
	} {
		if slices.Contains(deps(t, module+c.cmd), c.notCore) {
			t.Errorf("%s links %s", c.cmd, c.notCore)
		}
	}
	// The probe, a dig for operators, links no gRPC: it once linked 64
	// of its packages through a flag helper.
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+"cmd/servercount").Output()
	if err != nil {
		t.Fatalf("go list -deps cmd/servercount: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "google.golang.org/grpc") {
			t.Errorf("cmd/servercount links %s", p)
		}
	}
	// What ships links no test kit, suite or generator, and nothing
	// below cmd/ imports cmd/.
	shipped := deps(t, module+"cmd/...")
	for _, p := range shipped {
		if strings.HasPrefix(p, "internal/") && strings.HasSuffix(p, "test") ||
			strings.HasPrefix(p, "test/") || strings.HasPrefix(p, "hack/") {
			t.Errorf("the binaries link %s", p)
		}
		if !strings.HasPrefix(p, "cmd/") {
			for _, imp := range imports(t, p) {
				if strings.HasPrefix(imp, "cmd/") {
					t.Errorf("%s, linked by the binaries, imports %s", p, imp)
				}
			}
		}
	}
	// internal/ shows what ships: a package there is linked by the
	// binaries or is a test kit named ...test. Suites live in test/,
	// generators in hack/.
	for _, p := range goList(t, "-f", "{{.ImportPath}}", module+"internal/...") {
		if !strings.HasSuffix(p, "test") && !slices.Contains(shipped, p) {
			t.Errorf("%s is neither linked by the binaries nor a kit named ...test: move it to test/ or hack/", p)
		}
	}
}
