package flagvalue_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/flagvalue"
)

func parseEven(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err == nil && n%2 != 0 {
		err = fmt.Errorf("%d is odd", n)
	}
	return n, err
}

func TestVarParsesOnceAndNamesTheFlag(t *testing.T) {
	newSet := func() (*pflag.FlagSet, *int) {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		n := 2
		flagvalue.Var(fs, &n, "even", "2", parseEven, "an even number")
		return fs, &n
	}
	fs, n := newSet()
	require.NoError(t, fs.Parse(nil))
	assert.Equal(t, 2, *n, "the default")
	assert.Equal(t, "2", fs.Lookup("even").DefValue)

	fs, n = newSet()
	require.NoError(t, fs.Parse([]string{"--even=8"}))
	assert.Equal(t, 8, *n)
	assert.Equal(t, "8", fs.Lookup("even").Value.String())

	fs, n = newSet()
	err := fs.Parse([]string{"--even=3"})
	require.ErrorContains(t, err, `invalid argument "3" for "--even" flag: 3 is odd`)
	assert.Equal(t, 2, *n, "a refused value leaves the default")
}
