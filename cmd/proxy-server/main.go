// Command proxy-server is a Konnectivity-compatible proxy-server: it
// accepts proxy-agents and tunnels kube-apiserver's traffic through them,
// telling each agent how many servers to connect to.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/cmd/proxy-server/app"
	"github.com/servercount/servercount/cmd/proxy-server/app/options"
)

func main() {
	o := options.NewOptions()
	fs := o.Flags()
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "proxy-server: %v\n", err)
		os.Exit(2)
	}
	if errs := o.Validate(); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "proxy-server: %v\n", err)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := app.Run(ctx, o); err != nil {
		klog.ErrorS(err, "Proxy-server failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
