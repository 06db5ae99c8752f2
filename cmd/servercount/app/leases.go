package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/pkg/servercounter"
)

// countLeases counts the valid Leases as an agent with
// --count-server-leases does: one list through the same informer, the
// same validity rules. It waits --timeout × --attempts for the first
// list; an API server that does not answer by then leaves the count
// unknown (exit 2).
func countLeases(ctx context.Context, o *Options, stdout, stderr io.Writer) int {
	rc, err := kubeclient.Config(kubeclient.Options{Kubeconfig: o.Kubeconfig})
	if err != nil {
		fmt.Fprintf(stderr, "servercount: --kubeconfig: %v\n", err)
		return ExitUsage
	}
	c, err := o.leaseOptions().Build(rc, nil)
	if err != nil {
		fmt.Fprintf(stderr, "servercount: %v\n", err)
		return ExitUsage
	}
	defer c.Close()
	wait := o.Timeout * time.Duration(o.Attempts)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	count, err := 0, c.WaitSynced(ctx)
	if err == nil {
		var res servercounter.Result
		res, err = c.Count(ctx)
		count = res.Count
	}
	if err != nil {
		err = fmt.Errorf("no list of the Leases in %s within %s: %w", o.LeaseNamespace, wait, err)
	}
	printLeases(stdout, stderr, o, count, err)
	return exitCode(count, err)
}

func printLeases(stdout, stderr io.Writer, o *Options, count int, err error) {
	switch {
	case o.JSON:
		out := map[string]any{"source": "leases", "namespace": o.LeaseNamespace, "selector": o.LeaseSelector, "count": nil}
		if err != nil {
			out["error"] = err.Error()
		} else {
			out["count"] = count
		}
		_ = json.NewEncoder(stdout).Encode(out)
		return
	case err != nil:
		fmt.Fprintf(stderr, "servercount: %v\n", err)
		return
	case o.Short:
		fmt.Fprintln(stdout, count)
		return
	}
	fmt.Fprintf(stdout, ";; LEASES in namespace %s matching %q, valid as agents judge them\n", o.LeaseNamespace, o.LeaseSelector)
	fmt.Fprintf(stdout, ";; COUNT: %d, source: leases\n", count)
}
