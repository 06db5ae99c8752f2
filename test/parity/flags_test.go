package parity

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// helpFlag is one line of a --help: a flag, its type and its default.
type helpFlag struct {
	typ, def string
}

// flagLine matches a pflag --help line: "  -v, --v Level   text (default 4)".
var flagLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][\w-]*)(?: ([\w.]+))?\s{2,}(.*)$`)

// defaultOf is the "(default X)" at the end of a usage text.
var defaultOf = regexp.MustCompile(`\(default (.*)\)$`)

// helpFlags runs bin --help and returns its flags by name.
func helpFlags(t *testing.T, bin string) map[string]helpFlag {
	t.Helper()
	out, _ := exec.Command(bin, "--help").CombinedOutput() // the exit status is checked elsewhere
	flags := map[string]helpFlag{}
	for _, line := range strings.Split(string(out), "\n") {
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		f := helpFlag{typ: m[2]}
		if d := defaultOf.FindStringSubmatch(m[3]); d != nil {
			f.def = d[1]
		}
		flags[m[1]] = f
	}
	if len(flags) < 10 {
		t.Fatalf("%s --help listed %d flags:\n%s", bin, len(flags), out)
	}
	return flags
}

// randomDefaults are defaults drawn anew by every process; --help is
// cobra's own in upstream's listing, and pflag's in ours.
var randomDefaults = map[string]bool{"server-id": true, "agent-id": true, "help": true}

// Every flag of upstream's server and agent is accepted by ours, with the
// same type and default, the hidden and deprecated ones included.
func TestFlags(t *testing.T) {
	up, ours := sides(t)
	known := differences(t)
	for _, bin := range []struct{ name, up, ours string }{{"server", up.server, ours.server}, {"agent", up.agent, ours.agent}} {
		t.Run(bin.name, func(t *testing.T) {
			theirs, mine := helpFlags(t, bin.up), helpFlags(t, bin.ours)
			for name, f := range theirs {
				m, ok := mine[name]
				key := bin.name + " --" + name
				switch {
				case randomDefaults[name]:
				case !ok:
					t.Errorf("%s: upstream's --%s is missing from our --help", bin.name, name)
				case m.def != f.def:
					differ(t, known, key, "default %q, upstream's %q", m.def, f.def)
				case m.typ != f.typ:
					differ(t, known, key, "type %q, upstream's %q", m.typ, f.typ)
				}
			}
			// Ours that upstream lacks are in the table of
			// docs/operations.md, which operators read for them.
			documented := operationsFlags(t)
			for name := range mine {
				if _, theirsToo := theirs[name]; !theirsToo && !documented["--"+name] {
					t.Errorf("%s: our --%s, which upstream lacks, is not in docs/operations.md's table of such flags", bin.name, name)
				}
			}
			// Hidden upstream, so not in its --help, but accepted.
			for _, hidden := range hiddenFlags[bin.name] {
				arg := "--" + hidden + "=true"
				for _, b := range []string{bin.up, bin.ours} {
					out, err := exec.Command(b, arg, "--help").CombinedOutput()
					if err != nil {
						t.Errorf("%s %s --help: %v\n%s", b, arg, err, firstLine(out))
					}
				}
			}
		})
	}
}

// hiddenFlags are flags upstream accepts without listing them in --help.
var hiddenFlags = map[string][]string{"server": {"warn-on-channel-limit"}}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// operationsFlags are the flags named in the first column of the tables
// of docs/operations.md.
func operationsFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, line := range strings.Split(doc(t, "operations.md"), "\n") {
		first, _, ok := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		if !ok || !strings.HasPrefix(line, "| `--") {
			continue
		}
		for _, m := range regexp.MustCompile("`(--[a-z0-9-]+)`").FindAllStringSubmatch(first, -1) {
			flags[m[1]] = true
		}
	}
	return flags
}
