package servercounter_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/pkg/servercounter"
)

// exampleServer stands in for the cluster's DNS: a headless Service with
// three ready proxy-servers.
func exampleServer() *dnstest.Server {
	srv, err := dnstest.Start()
	if err != nil {
		log.Fatal(err)
	}
	srv.SetRecords(dnstest.Headless("proxy-server.kube-system.svc.cluster.local.", "agent", "tcp", 8091,
		"10.0.0.1", "10.0.0.2", "10.0.0.3")...)
	return srv
}

// Count the proxy-servers behind a headless Service, telling a valid zero
// from an unknown count.
func ExampleDNSServerCounter() {
	srv := exampleServer()
	defer srv.Close()

	c, err := servercounter.NewDNSServerCounter(servercounter.Config{
		// An SRV name: one record per ready endpoint and named port.
		Name:    "_agent._tcp.proxy-server.kube-system.svc.cluster.local.",
		Servers: []string{srv.Addr()}, // default: the nameservers of /etc/resolv.conf
		Max:     100,                  // never more than 100, whatever the answer says
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.Count(ctx)
	if err != nil {
		fmt.Println("count unknown:", err)
		return
	}
	fmt.Println(res.Count, res.Type, res.Outcome)
	// Output: 3 srv records
}

// Cache a DNS count for an agent's sync loop: reads are one atomic load,
// and a DNS outage keeps the last good count.
func ExampleCachedServerCounter() {
	srv := exampleServer()
	defer srv.Close()

	dnsCounter, err := servercounter.NewDNSServerCounter(servercounter.Config{
		Name:    "proxy-server.kube-system.svc.cluster.local.",
		Servers: []string{srv.Addr()},
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := servercounter.NewCachedServerCounter(dnsCounter, servercounter.CacheConfig{
		Fallback: 1, // answered until DNS has answered once
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// CountServers never waits: before DNS has answered it says 1, the
	// fallback. Count waits for the first answer, as long as its context
	// lets it.
	res, err := c.Count(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Count)
	var counter servercounter.ServerCounter = c
	fmt.Println(counter.CountServers())
	// Output:
	// 3
	// 3
}

// A fixed count, as upstream's --server-count.
func ExampleStaticServerCounter() {
	var c servercounter.ServerCounter = servercounter.StaticServerCounter(3)
	fmt.Println(c.CountServers())
	// Output: 3
}
