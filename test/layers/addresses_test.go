package layers

import (
	"bufio"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// notDialed lists the non-loopback host:port literals that test code
// names, by file, with why none of them is dialed outside a network
// namespace the test made. Every check of `make ci` runs where no route
// leads off the machine (.ci/offline); this list keeps the tests honest
// where they run on a developer's machine too.
var notDialed = map[string]map[string]string{
	"cmd/proxy-agent/main_test.go":     {"10.96.0.10:53": "an example in an expected flag error"},
	"internal/counting/dns_test.go":    {"10.96.0.10:53": "an example in an expected flag error"},
	"internal/explain/explain_test.go": {"10.0.0.5:8093": "URLs the test only parses", "10.0.0.5:8095": "URLs the test only parses"},
	"pkg/server/connect_fuzz_test.go":  {"10.0.0.1:443": "a CONNECT target given to the test agent, which dials only loopback"},
	"pkg/server/ordering_test.go":      {"10.0.0.1:22": "a CONNECT target given to the test agent, which dials only loopback"},
	"pkg/server/routes_test.go":        {"10.0.0.5:10250": "routing targets for test agents, which dial only loopback", "10.0.0.6:10250": "routing targets for test agents, which dial only loopback", "[fd00::5]:10250": "routing targets for test agents, which dial only loopback", "[fd00::6]:10250": "routing targets for test agents, which dial only loopback"},
	"pkg/server/server_test.go":        {"10.0.0.2:443": "routing targets for test agents, which dial only loopback", "[fd00::2]:443": "routing targets for test agents, which dial only loopback"},
	"pkg/servercounter/dns_test.go":    {"10.0.0.1:53": "a Config that fails validation", "10.96.0.10:53": "nameservers the test only parses", "[fd00::10]:53": "nameservers the test only parses", "10.0.0.1:8092": "endpoints built from SRV records, compared as strings", "10.0.0.2:8091": "endpoints built from SRV records, compared as strings", "[fd00::1]:8091": "endpoints built from SRV records, compared as strings", "10.0.0.10:9000": "endpoints built from A records, compared as strings", "10.0.0.1:9000": "endpoints built from A records, compared as strings", "10.0.0.9:9000": "endpoints built from A records, compared as strings"},
	"pkg/wire/codec_test.go":           {"10.0.0.1:443": "a DIAL_REQ the test only encodes"},
	"examples/library/main.go":         {"10.96.0.10:53": "an example in a comment"},
}

// hostPort matches an IPv4 or bracketed IPv6 literal with a port: the
// form a test dials or listens on.
var hostPort = regexp.MustCompile(`\b(?:\d{1,3}\.){3}\d{1,3}:\d{1,5}\b|\[[0-9a-fA-F:.]+\]:\d{1,5}\b`)

// testCode reports whether path, relative to the module's root, holds
// code that only tests run: tests, suites, test kits, examples and the
// scripts of CI and the Makefile.
func testCode(path string) bool {
	switch {
	case strings.HasSuffix(path, "_test.go"), path == "Makefile", strings.HasSuffix(path, ".sh"):
		return true
	}
	for _, dir := range []string{"test/", "e2e/", ".ci/", "examples/"} {
		if strings.HasPrefix(path, dir) {
			return true
		}
	}
	top, _, _ := strings.Cut(strings.TrimPrefix(path, "internal/"), "/")
	return strings.HasPrefix(path, "internal/") && strings.HasSuffix(top, "test")
}

// Test code names no address off the machine that it could dial: every
// host:port literal in it (IPv4, or IPv6 in brackets) is loopback, the
// unspecified address (a listener's), or listed in notDialed with the
// reason it is never dialed outside a namespace the test made. It covers
// literals only: an address built at run time, or a host name, is the
// business of the namespace the checks run in (.ci/offline), where no
// route leads off the machine.
func TestTestsNameOnlyLoopbackTargets(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (needs a git checkout)", err)
	}
	seen := map[string]map[string]bool{}
	for _, path := range strings.Fields(string(out)) {
		if !testCode(path) || path == "test/layers/addresses_test.go" { // its list names them all
			continue
		}
		f, err := os.Open("../../" + path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for line := 1; sc.Scan(); line++ {
			for _, lit := range hostPort.FindAllString(sc.Text(), -1) {
				ap, err := netip.ParseAddrPort(lit)
				if err != nil || ap.Addr().Unmap().IsLoopback() || ap.Addr().IsUnspecified() {
					continue // not an address, or one that stays on the machine
				}
				if _, ok := notDialed[path][lit]; ok {
					if seen[path] == nil {
						seen[path] = map[string]bool{}
					}
					seen[path][lit] = true
					continue
				}
				t.Errorf("%s:%d names %s: tests may dial only loopback or addresses in a network namespace they made; if this one is never dialed, add it to notDialed with the reason", path, line, lit)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	for path, lits := range notDialed {
		for lit := range lits {
			if !seen[path][lit] {
				t.Errorf("notDialed lists %s in %s, which no longer names it: take it out", lit, path)
			}
		}
	}
}
