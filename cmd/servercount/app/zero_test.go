package app_test

import (
	"testing"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/flagtest"
)

// Every count and duration flag of the probe, set to 0, is refused with
// a clear error: none has a 0 that means something.
func TestZeroValues(t *testing.T) {
	type zero = flagtest.Zero[*app.Options]
	named := func() *app.Options {
		o := app.NewOptions()
		o.Name = "proxy.example." // the NAME argument, which Parse would set
		return o
	}
	flagtest.ZeroValues(t, named, []string{"--watch"}, map[string]zero{
		"timeout":  {Refused: "invalid --timeout 0s: must be positive"},
		"attempts": {Refused: "invalid --attempts 0: must be at least 1"},
		"interval": {Refused: "invalid --interval 0s: must be positive"},
	})
}
