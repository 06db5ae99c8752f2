// Package flagvalue defines pflag flags whose text is parsed, once, into
// the typed value a program uses. It stands apart from internal/serve,
// which the binaries share, so that a package that only defines flags
// (internal/counting, and through it the servercount probe) links no
// gRPC.
package flagvalue

import "github.com/spf13/pflag"

// parsed is a flag whose text is parsed when it is set.
type parsed[T any] struct {
	p     *T
	parse func(string) (T, error)
	text  string
}

func (v *parsed[T]) Set(s string) error {
	t, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p, v.text = t, s
	return nil
}

func (v *parsed[T]) String() string { return v.text }

func (v *parsed[T]) Type() string { return "string" }

// Var defines a flag whose text parse turns into *p when the flag is
// set, so that a bad value is refused by Parse, naming the flag, and the
// program only ever sees the typed value. def is the text of *p's
// initial value, shown by --help.
func Var[T any](fs *pflag.FlagSet, p *T, name, def string, parse func(string) (T, error), usage string) {
	fs.Var(&parsed[T]{p: p, parse: parse, text: def}, name, usage)
}
