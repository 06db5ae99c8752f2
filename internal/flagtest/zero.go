package flagtest

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Zero is what a count or duration flag set to 0 does: Validate refuses
// it with an error that contains Refused, or it is accepted, its usage
// says what 0 means (it contains Means), and Check, if set, finds that
// meaning in the options' configuration.
type Zero[O Options] struct {
	Refused string
	Means   string
	Check   func(t *testing.T, o O)
}

// numeric is whether f takes a count or a duration.
func numeric(f *pflag.Flag) bool {
	switch f.Value.Type() {
	case "duration", "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float32", "float64":
		return true
	}
	return false
}

// ZeroValues sets each count and duration flag of newOptions' options, in
// turn, to 0 after base (a valid command line that turns on what those
// flags configure), and checks it against cases, which must name every
// such flag and no other: a flag added later must say what its 0 does.
func ZeroValues[O Options](t *testing.T, newOptions func() O, base []string, cases map[string]Zero[O]) {
	t.Helper()
	var names []string
	newOptions().Flags().VisitAll(func(f *pflag.Flag) {
		if numeric(f) {
			names = append(names, f.Name)
		}
	})
	for name := range cases {
		if !slices.Contains(names, name) {
			t.Errorf("a case for --%s, which is not a count or duration flag", name)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c, ok := cases[name]
			if !ok {
				t.Fatalf("--%s=0: no case says what it does: refuse it in Validate, or give 0 a meaning in its usage and the configuration", name)
			}
			o := newOptions()
			require.NoError(t, o.Flags().Parse(append(slices.Clone(base), "--"+name+"=0")))
			var msgs []string
			for _, err := range o.Validate() {
				msgs = append(msgs, err.Error())
			}
			if c.Refused != "" {
				assert.Contains(t, strings.Join(msgs, "\n"), c.Refused, "--%s=0 must be refused", name)
				return
			}
			require.Empty(t, msgs, "--%s=0 must be accepted", name)
			require.NotEmpty(t, c.Means, "--%s=0 is accepted: the case must say what it means", name)
			assert.Contains(t, o.Flags().Lookup(name).Usage, c.Means, "--%s's usage must say what 0 means", name)
			if c.Check != nil {
				c.Check(t, o)
			}
		})
	}
}
