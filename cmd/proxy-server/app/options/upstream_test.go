package options_test

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/upstream"
)

// Every flag of upstream's proxy-server (klog's included) is accepted, so that an
// upstream manifest's command line starts ours.
func TestUpstreamFlagsParse(t *testing.T) {
	t.Parallel()
	upstream.CheckFlags(t, upstream.ServerFlags, func() *pflag.FlagSet {
		fs := options.NewOptions().Flags()
		serve.AddKlogFlags(fs)
		return fs
	})
}
