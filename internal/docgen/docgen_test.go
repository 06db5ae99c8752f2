package docgen

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "write the references in docs/ again")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFlagsReferenceIsCurrent fails when docs/flags.md is not what the
// code generates: a flag added, renamed or given another default without
// `make docs`.
func TestFlagsReferenceIsCurrent(t *testing.T) {
	var got bytes.Buffer
	require.NoError(t, WriteFlags(&got, Binaries()))
	path := filepath.Join("..", "..", "docs", "flags.md")
	if *update {
		require.NoError(t, os.WriteFile(path, got.Bytes(), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run `make docs`")
	assert.Equal(t, string(want), got.String(), "docs/flags.md differs from the code: run `make docs`")
}

// TestFlagsReferenceIsStable: two generations are the same, so that no
// default taken from the environment or at random (an ID) lands in the
// reference.
func TestFlagsReferenceIsStable(t *testing.T) {
	var a, b bytes.Buffer
	require.NoError(t, WriteFlags(&a, Binaries()))
	require.NoError(t, WriteFlags(&b, Binaries()))
	assert.Equal(t, a.String(), b.String())
	for _, bin := range Binaries() {
		n := 0
		bin.Flags.VisitAll(func(*pflag.Flag) { n++ })
		assert.Greater(t, n, 5, "%s: too few flags", bin.Name)
	}
}
