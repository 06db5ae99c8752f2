// Command probe shows the servercount probe on one machine with no set-up: it starts
// an embedded DNS server serving a headless Service, then runs the
// servercount probe against it while the Service scales and its DNS fails.
//
//	make demo-probe   (or: go run ./examples/probe)
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

const svc = "proxy-server.kube-system.svc.cluster.local."

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	srv, err := dnstest.Start()
	if err != nil {
		return err
	}
	defer srv.Close()
	scale := func(n int) {
		ips := make([]string, n)
		for i := range ips {
			ips[i] = net.IPv4(10, 0, 0, byte(i+1)).String()
		}
		srv.SetRecords(dnstest.Headless(svc, "agent", "tcp", 8091, ips...)...)
	}
	probe := func(args ...string) {
		args = append([]string{"@" + srv.Addr()}, args...)
		fmt.Fprintf(out, "$ servercount %s\n", strings.Join(args, " "))
		code := app.Run(ctx, args, out, out)
		fmt.Fprintf(out, "(exit status %d)\n\n", code)
	}
	step := func(s string) { fmt.Fprintf(out, "=== %s\n\n", s) }

	step("A headless Service with 3 ready proxy-servers, counted by SRV target")
	scale(3)
	probe("_agent._tcp." + svc)

	step("Scaled to 5: the count follows DNS")
	scale(5)
	probe("--short", "_agent._tcp."+svc)

	step("Scaled to 0: Kubernetes answers NXDOMAIN, a valid zero (exit 1)")
	scale(0)
	probe(svc)

	step("DNS fails: the probe says the count is unknown (exit 2)")
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	probe("--timeout", "1s", svc)

	step("A cached counter keeps its last good count through the outage")
	srv.ClearFault()
	scale(3)
	dc, err := servercounter.NewDNSServerCounter(servercounter.Config{Name: svc, Servers: []string{srv.Addr()}, Attempts: 1})
	if err != nil {
		return err
	}
	cache, err := servercounter.NewCachedServerCounter(dc, servercounter.CacheConfig{Expiry: 50 * time.Millisecond, MinExpiry: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	defer cache.Close()
	// Count waits for the first answer (CountServers would say the
	// fallback until it came).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	first, err := cache.Count(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cached count: %d\n", first.Count)
	srv.SetFault(dnstest.Fault{Kind: dnstest.FaultServFail})
	failed := srv.Queries("")
	deadline := time.Now().Add(5 * time.Second)
	for srv.Queries("") < failed+3 && time.Now().Before(deadline) {
		cache.CountServers()
		time.Sleep(10 * time.Millisecond) // a reader's pace, not synchronisation
	}
	fmt.Fprintf(out, "after %d failed refreshes: %d\n", srv.Queries("")-failed, cache.CountServers())
	return nil
}
