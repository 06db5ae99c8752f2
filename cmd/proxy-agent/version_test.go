package main

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/proctest"
)

// Both binaries print one line with the version, the commit and the Go
// version, and exit 0, before checking flags that a start needs.
func TestBinariesPrintVersion(t *testing.T) {
	for _, name := range []string{"proxy-agent", "proxy-server"} {
		bin := proctest.Build(t, "cmd/"+name)
		out, err := exec.CommandContext(t.Context(), bin, "--version").CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Regexp(t, `^`+name+` \S+ \(commit \S+, go\S+, \w+/\w+\)\n$`, string(out))
	}
}
