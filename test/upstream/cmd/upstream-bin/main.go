// Command upstream-bin prints the directory of upstream's built server,
// agent, test-client and test-server, building them first if need be (see
// upstream.Find), and with -src the source tree they were built from. When
// there is nothing to build from it prints one line saying how to get
// them, and exits 3: the Makefile's targets then skip.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/servercount/servercount/test/upstream"
)

func main() {
	src := flag.Bool("src", false, "print the source tree instead of the binaries' directory")
	flag.Parse()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, err := upstream.Find(context.Background(), wd)
	switch {
	case errors.Is(err, upstream.ErrUnavailable):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case *src && b.Source == "":
		fmt.Fprintf(os.Stderr, "upstream's binaries come from $%s: set $%s to its source for its suite\n", upstream.EnvBin, upstream.EnvSource)
		os.Exit(3)
	case *src:
		fmt.Println(b.Source)
	default:
		fmt.Println(filepath.Dir(b.Server))
	}
}
