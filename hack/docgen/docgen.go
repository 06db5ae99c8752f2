// Package docgen writes the references in docs/ that are facts of the
// code, so that they are written once: the flags of the three binaries
// (docs/flags.md) and the metrics of the proxy-server and the proxy-agent
// (docs/metrics.md). Its tests fail when a checked-in reference differs
// from what the code generates; `make docs` writes them again.
package docgen

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	agentoptions "github.com/servercount/servercount/cmd/proxy-agent/app/options"
	serveroptions "github.com/servercount/servercount/cmd/proxy-server/app/options"
	probe "github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/serve"
)

// Binary is one program and its flags, as it parses them.
type Binary struct {
	// Name is the program's name.
	Name string
	// About says in a sentence what the program is.
	About string
	// Flags are every flag the program accepts.
	Flags *pflag.FlagSet
}

// Binaries returns the three binaries, each with the flag set it parses:
// its own flags and, for the proxy-server and the proxy-agent, klog's and
// --version.
func Binaries() []Binary {
	server := serveroptions.NewOptions().Flags()
	serve.AddCommonFlags(server)
	agent := agentoptions.NewOptions().Flags()
	serve.AddCommonFlags(agent)
	return []Binary{
		{Name: "proxy-server", About: "The proxy-server: frontends (kube-apiserver) on one side, agents on the other.", Flags: server},
		{Name: "proxy-agent", About: "The proxy-agent: one connection to every proxy-server, dials into the cluster for them.", Flags: agent},
		{Name: "servercount", About: "The probe: `servercount [@server[:port]] [flags] NAME [TYPE]`.", Flags: probe.NewOptions().Flags()},
	}
}

// WriteFlags writes the flag reference of bins in Markdown: a table per
// binary with each flag's name, type, default and help text, in the
// order the binary lists them.
func WriteFlags(w io.Writer, bins []Binary) error {
	var b strings.Builder
	b.WriteString("# Flags\n\n")
	b.WriteString("Generated from the code by `make docs` (hack/docgen); a test fails\n")
	b.WriteString("when this file and the code differ. Flags marked *hidden* are accepted\n")
	b.WriteString("but left out of `--help`; *deprecated* ones also print a warning when set.\n")
	b.WriteString("Defaults taken from the environment at start-up are shown as the code\n")
	b.WriteString("states them, not as one machine's values.\n")
	for _, bin := range bins {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", bin.Name, bin.About)
		b.WriteString("| flag | type | default | meaning |\n| --- | --- | --- | --- |\n")
		bin.Flags.VisitAll(func(f *pflag.Flag) {
			name := "`--" + f.Name + "`"
			if f.Shorthand != "" {
				name += ", `-" + f.Shorthand + "`"
			}
			usage := f.Usage
			switch {
			case f.Deprecated != "":
				usage = "*deprecated:* " + f.Deprecated + ". " + usage
			case f.Hidden:
				usage = "*hidden.* " + usage
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, f.Value.Type(), defaultText(f), cell(usage))
		})
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// defaultText is f's default as a table cell: empty for no default.
func defaultText(f *pflag.Flag) string {
	switch d := f.DefValue; d {
	case "", "[]":
		return ""
	default:
		return "`" + strings.ReplaceAll(d, "|", "\\|") + "`"
	}
}

// cell makes text safe inside a Markdown table cell.
func cell(text string) string {
	text = strings.ReplaceAll(text, "|", "\\|")
	return strings.Join(strings.Fields(text), " ")
}
