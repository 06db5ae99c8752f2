// Package flagtest checks a binary's command line in tests: which
// arguments its flags refuse, and which problems its validation reports.
package flagtest

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Options is a binary's command line: flags bound to it, and a check
// that returns every problem.
type Options interface {
	Flags() *pflag.FlagSet
	Validate() []error
}

// Case is one command line and what is wrong with it.
type Case struct {
	Name string
	Args []string
	// WantErr are the problems Validate reports, one text each (a part of
	// its message); none means the command line is valid.
	WantErr []string
	// WantParseErr is the error of a value refused by the flag itself,
	// before Validate.
	WantParseErr string
}

// Validate runs each case, in parallel, on fresh options from
// newOptions: the flags must refuse what WantParseErr says, and Validate
// must report exactly the problems of WantErr.
func Validate[O Options](t *testing.T, newOptions func() O, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			o := newOptions()
			err := o.Flags().Parse(tc.Args)
			if tc.WantParseErr != "" {
				require.ErrorContains(t, err, tc.WantParseErr)
				return
			}
			require.NoError(t, err)
			var msgs []string
			for _, err := range o.Validate() {
				msgs = append(msgs, err.Error())
			}
			all := strings.Join(msgs, "\n")
			for _, w := range tc.WantErr {
				assert.Contains(t, all, w)
			}
			assert.Len(t, msgs, len(tc.WantErr), all)
		})
	}
}

// Usage returns the line of fs's usage that documents flag (as
// "--name"), or fails the test.
func Usage(t *testing.T, fs *pflag.FlagSet, flag string) string {
	t.Helper()
	for _, l := range strings.Split(fs.FlagUsages(), "\n") {
		if strings.Contains(l, flag+" ") {
			return l
		}
	}
	t.Fatalf("no usage line for %s", flag)
	return ""
}
