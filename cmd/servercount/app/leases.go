package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/leaseopts"
	"github.com/servercount/servercount/pkg/servercounter"
)

// leasePoll is how often countLeases asks the counter whether its first
// list has ended.
const leasePoll = 20 * time.Millisecond

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
	lo := leaseopts.CountOptions{Enabled: true, Namespace: o.LeaseNamespace, LabelSelector: o.LeaseSelector}
	c, err := lo.Build(rc, nil)
	if err != nil {
		fmt.Fprintf(stderr, "servercount: %v\n", err)
		return ExitUsage
	}
	defer c.Close()
	wait := o.Timeout * time.Duration(o.Attempts)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	count, err := firstCount(ctx, c)
	if err != nil {
		err = fmt.Errorf("no list of the Leases in %s within %s: %w", o.LeaseNamespace, wait, err)
	}
	printLeases(stdout, stderr, o, count, err)
	switch {
	case err != nil:
		return ExitError
	case count == 0:
		return ExitZero
	}
	return ExitOK
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

// firstCount waits for c's first count, which it has once its first list
// has ended.
func firstCount(ctx context.Context, c servercounter.Counter) (int, error) {
	tick := time.NewTicker(leasePoll)
	defer tick.Stop()
	for {
		res, err := c.Count(ctx)
		if err == nil {
			return res.Count, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
