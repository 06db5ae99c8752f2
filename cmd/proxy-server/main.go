// Command proxy-server is a Konnectivity-compatible proxy-server: it
// accepts proxy-agents and tunnels kube-apiserver's traffic through them,
// telling each agent how many servers to connect to.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/servercount/servercount/cmd/proxy-server/app"
	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
)

func main() {
	o := options.NewOptions()
	serve.Main("proxy-server", o.Flags(), os.Args[1:], o.Validate, func() error {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		return app.Run(ctx, o.Config())
	})
}
