// Command servercount counts the servers behind a DNS name, the way the
// proxy-agent's --server-count-dns does, and prints what it saw, like dig.
//
//	servercount [@server[:port]] [flags] NAME [TYPE]
//
// Exit status: 0 when the count is above zero, 1 for a valid zero
// (NXDOMAIN or NODATA), 2 when the name could not be resolved, 64 for a
// usage error.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/servercount/servercount/cmd/servercount/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
