package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spf13/pflag"

	"github.com/servercount/servercount/internal/explain"
)

// Exit codes of `servercount explain`, in the probe's sense: 0 all is
// well, 1 an answer that is not (something is failing), 2 no answer.
const (
	// ExitExplainHealthy: nothing is failing.
	ExitExplainHealthy = 0
	// ExitExplainProblems: the report names a problem.
	ExitExplainProblems = 1
	// ExitExplainUnreadable: the metrics could not be read, or are not a
	// proxy-agent's or a proxy-server's.
	ExitExplainUnreadable = 2
)

// runExplain is `servercount explain [--json] [--timeout D] URL`.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("servercount explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the metrics")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: servercount explain [--json] [--timeout D] URL\n\nReads a proxy-agent's or proxy-server's /metrics (URL, e.g. http://10.0.0.5:8093)\nand says what it holds, what it aims for and why, and what is failing.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintf(stderr, "servercount explain: %v (see --help)\n", err)
		return ExitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "servercount explain: give one URL, the health or admin address of a proxy-agent or proxy-server (see --help)")
		return ExitUsage
	}
	url, err := explain.MetricsURL(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "servercount explain: %v\n", err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := explain.Read(ctx, client, url)
	if err != nil {
		if *asJSON {
			_ = json.NewEncoder(stdout).Encode(map[string]string{"url": url, "error": err.Error()})
		}
		fmt.Fprintf(stderr, "servercount explain: %v\n", err)
		return ExitExplainUnreadable
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = r.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "servercount explain: %v\n", err)
		return ExitExplainUnreadable
	}
	if !r.Healthy() {
		return ExitExplainProblems
	}
	return ExitExplainHealthy
}
