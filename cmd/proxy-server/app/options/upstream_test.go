package options_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/upstream"
)

// Every flag of upstream's proxy-server (klog's included) parses, so that an
// upstream manifest's command line starts ours.
func TestUpstreamFlagsParse(t *testing.T) {
	t.Parallel()
	for _, f := range upstream.ServerFlags {
		fs := options.NewOptions().Flags()
		serve.AddKlogFlags(fs)
		assert.NoError(t, fs.Parse([]string{f.Arg()}), "upstream flag --%s (%s)", f.Name, f.Type)
	}
}
