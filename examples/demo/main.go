// Command demo shows servercount's reason to be, on one machine with no
// set-up: a proxy-agent that counts proxy-servers through DNS follows them
// as they scale from 3 to 5 and down to 2.
//
// It starts an embedded DNS server serving a headless-style name, an HTTP
// target, proxy-servers on loopback addresses 127.0.0.2 and up (each the
// proxy-server command's own code, run in this process with its flags),
// and one proxy-agent with --server-count-dns and
// --server-dial-mode=resolved. At each step it prints what the agent
// counts, how many servers it holds, how many dials it spent, and a
// request proxied through each server. It ends by itself and stops
// everything it started.
//
//	make demo   (or: go run ./examples/demo [-chart demo.png])
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"
)

func main() {
	// The servers and the agent log as the binaries do; the demo's own
	// lines tell the story.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	klog.SetOutput(io.Discard)

	chartPath := flag.String("chart", "", "also write a PNG chart of the agent's counts and connections over time to this file")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *chartPath); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
