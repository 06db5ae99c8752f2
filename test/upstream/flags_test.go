package upstream

import (
	"flag"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"

	agentoptions "github.com/servercount/servercount/cmd/proxy-agent/app/options"
	serveroptions "github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
)

// Every flag of upstream's proxy-agent and proxy-server, klog's included,
// is accepted by ours, so that an upstream manifest's command line starts
// ours. Our own flags are parsed with a value upstream accepts; klog's
// are only looked up, since parsing them would change the test process's
// logging.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOursTakeUpstreamsFlags(t *testing.T) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, binary := range []struct {
		name     string
		want     []Flag
		newFlags func() *pflag.FlagSet
	}{
		{"proxy-agent", AgentFlags, func() *pflag.FlagSet { return agentoptions.NewOptions().Flags() }},
		{"proxy-server", ServerFlags, func() *pflag.FlagSet { return serveroptions.NewOptions().Flags() }},
	} {
		t.Run(binary.name, func(t *testing.T) {
			for _, f := range binary.want {
				fs := binary.newFlags()
				serve.AddKlogFlags(fs) // as the binary parses them
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
		})
	}
}
