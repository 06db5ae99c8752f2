package serve_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/serve"
)

// klog's flags are taken in both spellings, as upstream's binaries take
// them; so are ours.
func TestKlogFlagsInBothSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"--log-file=/tmp/x.log", "--skip-headers", "--one-output", "--alsologtostderr", "--log-file-max-size=10", "--v=2", "--stderrthreshold=INFO", "--my-flag=1"},
		{"--log_file=/tmp/x.log", "--skip_headers", "--one_output", "--alsologtostderr", "--log_file_max_size=10", "-v=2", "--stderrthreshold=INFO", "--my_flag=1"},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		var mine int
		fs.IntVar(&mine, "my-flag", 0, "")
		serve.AddKlogFlags(fs)
		require.NoError(t, fs.Parse(args), "%v", args)
		assert.Equal(t, 1, mine)
		for _, name := range []string{"log-file", "log_file", "skip-headers", "one-output"} {
			assert.True(t, fs.Changed(name), "%s in %v", name, args)
		}
	}
}
