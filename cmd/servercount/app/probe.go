package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/servercount/servercount/internal/version"
	"github.com/servercount/servercount/pkg/servercounter"
)

// Run runs the probe with args (without the program name), writes results
// to stdout and problems to stderr, and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "explain" {
		return runExplain(ctx, args[1:], stdout, stderr)
	}
	o := NewOptions()
	if err := o.Parse(args, stderr); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintf(stderr, "servercount: %v (see --help)\n", err)
		return ExitUsage
	}
	if o.Version {
		fmt.Fprintf(stdout, "servercount %s\n", version.Get())
		return ExitOK
	}
	if errs := o.Validate(); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(stderr, "servercount: %v\n", err)
		}
		return ExitUsage
	}
	if o.Leases {
		return countLeases(ctx, o, stdout, stderr)
	}
	c, err := servercounter.NewDNSServerCounter(o.Config())
	if err != nil {
		// One line per problem, in the probe's voice.
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "servercount: %s\n", strings.TrimPrefix(line, "servercounter: "))
		}
		return ExitUsage
	}
	p := &printer{o: o, w: stdout, args: args, types: c.Type()}
	if o.Watch {
		return watch(ctx, o, c, p, stderr)
	}
	res, err := c.Count(ctx)
	if err != nil && !o.JSON {
		fmt.Fprintf(stderr, "servercount: %v\n", err)
	}
	p.print(res, err)
	return exitCode(res.Count, err)
}

// watch counts every --interval and prints a line whenever the count or the
// failure changes, until ctx ends. It returns the exit code of the last
// count.
func watch(ctx context.Context, o *Options, c *servercounter.DNSServerCounter, p *printer, stderr io.Writer) int {
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	var (
		last     = ""
		lastCode = ExitError
	)
	for {
		res, err := c.Count(ctx)
		if ctx.Err() != nil {
			return lastCode
		}
		if state := watchState(res, err); state != last {
			p.printWatch(time.Now(), res, err)
			last = state
		}
		lastCode = exitCode(res.Count, err)
		select {
		case <-ctx.Done():
			return lastCode
		case <-t.C:
		}
	}
}

// watchState is what a watch line reports: the count, or the kind of
// failure.
func watchState(res servercounter.Result, err error) string {
	var de *servercounter.DNSError
	if errors.As(err, &de) {
		return "error " + de.Kind.String()
	}
	if err != nil {
		return "error"
	}
	return fmt.Sprint(res.Count)
}

// exitCode is the exit status for a count and its error, whatever the
// source.
func exitCode(count int, err error) int {
	switch {
	case err != nil:
		return ExitError
	case count == 0:
		return ExitZero
	}
	return ExitOK
}
