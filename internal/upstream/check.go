package upstream

import (
	"flag"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// CheckFlags checks that every flag of want is accepted by the flag sets
// that newFlags makes (each with klog's flags added, as the binary parses
// them). Our own flags are parsed with a value upstream accepts; klog's
// are only looked up, since parsing them would change the test process's
// logging.
func CheckFlags(t *testing.T, want []Flag, newFlags func() *pflag.FlagSet) {
	t.Helper()
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, f := range want {
		fs := newFlags()
		if klogFlags.Lookup(strings.ReplaceAll(f.Name, "-", "_")) != nil || klogFlags.Lookup(f.Name) != nil {
			if fs.Lookup(f.Name) == nil {
				t.Errorf("upstream (klog) flag --%s is not accepted", f.Name)
			}
			continue
		}
		if err := fs.Parse([]string{f.Arg()}); err != nil {
			t.Errorf("upstream flag --%s (%s): %v", f.Name, f.Type, err)
		}
	}
}
