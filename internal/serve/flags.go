package serve

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// ParseFlags adds klog's flags (-v and friends) to fs, parses args and
// validates them. On a problem it prints one line per problem, prefixed by
// the program's name, and exits with status 2; on --help it exits 0.
func ParseFlags(name string, fs *pflag.FlagSet, args []string, validate func() []error) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if errs := validate(); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		}
		os.Exit(2)
	}
}
