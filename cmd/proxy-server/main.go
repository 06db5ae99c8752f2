// Command proxy-server is a Konnectivity-compatible proxy-server: it
// accepts proxy-agents and tunnels kube-apiserver's traffic through them,
// telling each agent how many servers to connect to.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-server/app"
	"github.com/servercount/servercount/cmd/proxy-server/app/options"
	"github.com/servercount/servercount/internal/serve"
)

func main() {
	o := options.NewOptions()
	fs := o.Flags()
	serve.ParseFlags("proxy-server", fs, os.Args[1:], o.Validate)
	if ignored := o.Ignored(fs); len(ignored) > 0 {
		klog.InfoS("Ignored flags that have no effect in this server", "flags", ignored)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := app.Run(ctx, o.Config()); err != nil {
		klog.ErrorS(err, "Proxy-server failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
