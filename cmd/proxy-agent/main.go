// Command proxy-agent is a Konnectivity-compatible proxy-agent: it keeps a
// connection to every proxy-server and dials, on their behalf, into the
// cluster network.
//
// The first SIGTERM drains, as upstream's agent does: the agent tells
// the servers, opens no new server connection and keeps serving, open
// tunnels and new ones, until a second signal stops it. The drain is
// bounded by --drain-timeout: a second signal sent right after the first
// may be merged into it by the Go runtime.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/servercount/servercount/cmd/proxy-agent/app"
	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
	"github.com/servercount/servercount/internal/serve"
)

func main() {
	o := options.NewOptions()
	serve.Main("proxy-agent", o.Flags(), os.Args[1:], o.Validate, func() error {
		// First signal: drain. Second: stop.
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
		drain, startDrain := context.WithCancel(context.Background())
		ctx, stop := context.WithCancel(context.Background())
		go func() {
			<-sigs
			startDrain()
			<-sigs
			stop()
		}()
		return app.Run(ctx, drain, o.Config())
	})
}
