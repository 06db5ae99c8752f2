package options_test

import (
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/upstream"
)

// Every flag of upstream's proxy-server (klog's included) is accepted, so that an
// upstream manifest's command line starts ours. Our own flags parse with
// a value upstream accepts; klog's are only looked up, since parsing them
// would change this test process's logging.
func TestUpstreamFlagsParse(t *testing.T) {
	t.Parallel()
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, f := range upstream.ServerFlags {
		fs := options.NewOptions().Flags()
		serve.AddKlogFlags(fs)
		if klogFlags.Lookup(strings.ReplaceAll(f.Name, "-", "_")) != nil || klogFlags.Lookup(f.Name) != nil {
			assert.NotNil(t, fs.Lookup(f.Name), "upstream (klog) flag --%s", f.Name)
			continue
		}
		assert.NoError(t, fs.Parse([]string{f.Arg()}), "upstream flag --%s (%s)", f.Name, f.Type)
	}
}
