// Package app is the servercount probe: argument parsing, one count or a
// watch, and the output for people (dig-style) and machines (JSON).
package app

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/pkg/lease"
	"github.com/servercount/servercount/pkg/servercounter"
)

// Exit codes of the probe.
const (
	// ExitOK: the count is above zero.
	ExitOK = 0
	// ExitZero: a valid answer of zero servers (NXDOMAIN or NODATA).
	ExitZero = 1
	// ExitError: the name could not be resolved; the count is unknown.
	ExitError = 2
	// ExitUsage: the command line is wrong (sysexits EX_USAGE).
	ExitUsage = 64
)

// Options is the probe's command line.
type Options struct {
	// Name is the DNS name to count.
	Name string
	// Servers are the nameservers given as @server[:port]; empty means
	// resolv.conf.
	Servers []string
	// Type is auto, srv, a, aaaa or ip.
	Type string
	// Timeout is how long each attempt waits for its answer before the
	// next starts, as dig's +timeout.
	Timeout time.Duration
	// Attempts is how many times a count is tried.
	Attempts int
	// TCP asks over TCP only.
	TCP bool
	// Short prints the count alone.
	Short bool
	// JSON prints one JSON object per count.
	JSON bool
	// Watch counts every Interval and prints a line when the count
	// changes, until interrupted.
	Watch    bool
	Interval time.Duration
	// ResolvConf is the resolv.conf to read.
	ResolvConf string
	// Leases counts the proxy-servers' valid Leases, as agents with
	// --count-server-leases do, instead of a DNS name.
	Leases bool
	// Kubeconfig reaches the API server for Leases (empty: in-cluster).
	Kubeconfig string
	// LeaseNamespace and LeaseSelector select the Leases.
	LeaseNamespace, LeaseSelector string
	// Version prints the version instead of counting.
	Version bool
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Type:       "auto",
		Timeout:    5 * time.Second,
		Attempts:   servercounter.DefaultAttempts,
		Interval:   2 * time.Second,
		ResolvConf: servercounter.DefaultResolvConf,

		LeaseNamespace: lease.DefaultNamespace,
		LeaseSelector:  lease.DefaultLabelSelector,
	}
}

// Flags returns the probe's flags, bound to o.
func (o *Options) Flags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("servercount", pflag.ContinueOnError)
	fs.StringVarP(&o.Type, "type", "t", o.Type, "record type to count: auto (srv for names starting with _, else ip), srv, a, aaaa, ip (A and AAAA, the larger family)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long each attempt waits for an answer before the next starts (it keeps listening), as dig's +timeout")
	fs.IntVar(&o.Attempts, "attempts", o.Attempts, "tries per count, each against the next nameserver")
	fs.BoolVar(&o.TCP, "tcp", o.TCP, "query over TCP only")
	fs.BoolVar(&o.Short, "short", o.Short, "print only the count")
	fs.BoolVar(&o.JSON, "json", o.JSON, "print the result as JSON")
	fs.BoolVarP(&o.Watch, "watch", "w", o.Watch, "count every --interval and print a line when the count changes, until interrupted")
	fs.DurationVar(&o.Interval, "interval", o.Interval, "time between counts with --watch")
	fs.StringVar(&o.ResolvConf, "resolv-conf", o.ResolvConf, "resolv.conf whose nameservers, search list and ndots apply")
	fs.BoolVar(&o.Leases, "leases", o.Leases, "count the proxy-servers' valid Leases, as agents with --count-server-leases do, instead of a DNS name")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of the API server with --leases (empty: in-cluster)")
	fs.StringVar(&o.LeaseNamespace, "lease-namespace", o.LeaseNamespace, "namespace of the Leases with --leases")
	fs.StringVar(&o.LeaseSelector, "lease-label-selector", o.LeaseSelector, "label selector of the Leases with --leases")
	fs.BoolVar(&o.Version, "version", o.Version, "print the version and exit")
	fs.SortFlags = false
	return fs
}

// Parse parses args in dig's grammar: @server arguments, flags anywhere,
// the name, and optionally a record type after it.
func (o *Options) Parse(args []string, stderr io.Writer) error {
	fs := o.Flags()
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			usage(stderr, fs)
		}
		return err
	}
	for _, a := range fs.Args() {
		switch {
		case strings.HasPrefix(a, "@"):
			o.Servers = append(o.Servers, strings.TrimPrefix(a, "@"))
		case o.Name == "":
			o.Name = a
		case fs.Changed("type"):
			return fmt.Errorf("unexpected argument %q: give one NAME; the type is already set by --type", a)
		default:
			o.Type = a
			if _, err := servercounter.ParseRecordType(a); err != nil {
				return fmt.Errorf("unexpected argument %q after NAME %q: only a record type (srv, a, aaaa, ip) may follow it", a, o.Name)
			}
		}
	}
	return nil
}

// Validate returns every problem with o, each naming the flag or argument.
func (o *Options) Validate() []error {
	var errs []error
	switch {
	case o.Leases && (o.Name != "" || len(o.Servers) > 0):
		errs = append(errs, errors.New("--leases counts Leases, not a DNS name: drop NAME and @server"))
	case o.Leases && o.Watch:
		errs = append(errs, errors.New("--watch works with a DNS name, not with --leases"))
	case o.Leases:
		errs = append(errs, o.leaseOptions().Validate()...)
	case o.Name == "":
		errs = append(errs, errors.New("missing NAME: give the DNS name to count, e.g. proxy-server.kube-system.svc.cluster.local, or --leases"))
	}
	if _, err := servercounter.ParseRecordType(o.Type); err != nil {
		errs = append(errs, fmt.Errorf("invalid --type %q: use one of auto, srv, a, aaaa, ip", o.Type))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("invalid --timeout %v: must be positive", o.Timeout))
	}
	if o.Attempts < 1 {
		errs = append(errs, fmt.Errorf("invalid --attempts %d: must be at least 1", o.Attempts))
	}
	if o.Watch && o.Interval <= 0 {
		errs = append(errs, fmt.Errorf("invalid --interval %v: must be positive", o.Interval))
	}
	if o.Short && o.JSON {
		errs = append(errs, errors.New("--short and --json exclude each other: pick one"))
	}
	for _, s := range o.Servers {
		if s == "" {
			errs = append(errs, errors.New("empty @server: write @10.96.0.10 or @127.0.0.1:5353"))
		}
	}
	return errs
}

// leaseOptions are --leases and its flags as an agent's lease flags, so
// that the probe validates and counts as agents do.
func (o *Options) leaseOptions() *counting.LeaseOptions {
	return &counting.LeaseOptions{Enabled: true, Namespace: o.LeaseNamespace, LabelSelector: o.LeaseSelector}
}

// Config returns the counter configuration for o.
func (o *Options) Config() servercounter.Config {
	typ, _ := servercounter.ParseRecordType(o.Type)
	return servercounter.Config{
		Name:       o.Name,
		Type:       typ,
		Servers:    o.Servers,
		ResolvConf: o.ResolvConf,
		Timeout:    o.Timeout,
		Attempts:   o.Attempts,
		TCP:        o.TCP,
	}
}

func usage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprintf(w, `Usage: servercount [@server[:port]] [flags] NAME [TYPE]
       servercount --leases [--kubeconfig FILE] [flags]
       servercount explain URL

Counts the servers behind a DNS name: distinct SRV targets, or distinct
addresses (A, AAAA, or the larger of both). Without @server it asks the
nameservers of resolv.conf, and a NAME without a trailing dot follows its
search list, as a pod's resolver does.

Exit status: 0 count above zero, 1 valid zero (NXDOMAIN/NODATA),
2 resolution failed, 64 usage error.

Flags:
%s`, fs.FlagUsages())
}
