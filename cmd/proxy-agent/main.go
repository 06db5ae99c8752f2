// Command proxy-agent is a Konnectivity-compatible proxy-agent: it keeps a
// connection to every proxy-server and dials, on their behalf, into the
// cluster network.
//
// The first SIGTERM drains (the agent tells the servers and keeps serving);
// a second one stops it.
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

	"github.com/servercount/servercount/cmd/proxy-agent/app"
	"github.com/servercount/servercount/cmd/proxy-agent/app/options"
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
		fmt.Fprintf(os.Stderr, "proxy-agent: %v\n", err)
		os.Exit(2)
	}
	if errs := o.Validate(); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "proxy-agent: %v\n", err)
		}
		os.Exit(2)
	}
	if ignored := o.Ignored(fs); len(ignored) > 0 {
		klog.InfoS("Ignored flags that have no effect in this agent", "flags", ignored)
	}

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
	if err := app.Run(ctx, drain, o); err != nil {
		klog.ErrorS(err, "Proxy-agent failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
