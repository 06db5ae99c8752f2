package serve

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/version"
)

// ParseFlags adds klog's flags (-v and friends) and --version to fs,
// parses args and validates them. On a problem it prints one line per
// problem, prefixed by the program's name, and exits with status 2; on
// --help or --version it exits 0.
func ParseFlags(name string, fs *pflag.FlagSet, args []string, validate func() []error) {
	showVersion := AddCommonFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if *showVersion {
		fmt.Printf("%s %s\n", name, version.Get())
		os.Exit(0)
	}
	if errs := validate(); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		os.Exit(2)
	}
}

// AddCommonFlags adds what every binary has besides its own flags:
// klog's flags and --version, whose value it returns. The flag reference
// in docs/flags.md is generated from the same set.
func AddCommonFlags(fs *pflag.FlagSet) (showVersion *bool) {
	AddKlogFlags(fs)
	return fs.Bool("version", false, "print the version and exit")
}

// compatibilityFlags are upstream's flags that the binaries take, so
// that an upstream manifest starts them, and ignore: what they tune has
// bounds of its own here.
var compatibilityFlags = []string{"enable-contention-profiling", "warn-on-channel-limit", "xfr-channel-size", "frontend-write-channel-size"}

// IgnoredFlags returns the compatibility flags set in fs, which have no
// effect, for a log line at start-up.
func IgnoredFlags(fs *pflag.FlagSet) []string {
	var set []string
	for _, n := range compatibilityFlags {
		if fs.Changed(n) {
			set = append(set, "--"+n)
		}
	}
	return set
}

// Main is a binary's main after its flags are made: it parses args into
// fs and validates them (see ParseFlags), logs the compatibility flags
// set to no effect, and runs run. When run fails it logs why and exits
// with status 1. The log is flushed either way.
func Main(name string, fs *pflag.FlagSet, args []string, validate func() []error, run func() error) {
	ParseFlags(name, fs, args, validate)
	if ignored := IgnoredFlags(fs); len(ignored) > 0 {
		klog.InfoS("Ignored flags that have no effect", "program", name, "flags", ignored)
	}
	err := run()
	if err != nil {
		klog.ErrorS(err, "Stopped on an error", "program", name)
	}
	klog.Flush()
	if err != nil {
		os.Exit(1)
	}
}

// IDFromEnv returns the value of the environment variable env, or a new
// random ID when it is unset or empty: upstream's binaries take their
// default --server-id and --agent-id so (PROXY_SERVER_ID,
// PROXY_AGENT_ID), and the flag, when set, wins.
func IDFromEnv(env string) string {
	if id := os.Getenv(env); id != "" {
		return id
	}
	return RandomID()
}

// AddKlogFlags adds klog's flags to fs and makes fs take every flag in
// either spelling, as Kubernetes components do: klog names its flags with
// underscores (--log_file), manifests often use dashes (--log-file).
func AddKlogFlags(fs *pflag.FlagSet) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
	})
}
