// Command library shows the servercounter library as a program would use
// it: a DNS counter behind a cache with a static fallback.
//
//	go run ./examples/library --name proxy-server.kube-system.svc.cluster.local --server 10.96.0.10:53
//
// Without --server it asks the nameservers of /etc/resolv.conf.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/servercount/servercount/pkg/servercounter"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "library:", err)
		os.Exit(1)
	}
}

func run() error {
	name := flag.String("name", "", "DNS name of the servers' headless Service (required)")
	server := flag.String("server", "", "nameserver host:port (default: /etc/resolv.conf)")
	fallback := flag.Int("fallback", 1, "count to use until DNS has answered")
	flag.Parse()
	if *name == "" {
		return errors.New("missing --name: give the DNS name of the servers' headless Service")
	}

	cfg := servercounter.Config{Name: *name, Max: 100}
	if *server != "" {
		cfg.Servers = []string{*server}
	}
	dnsCounter, err := servercounter.NewDNSServerCounter(cfg)
	if err != nil {
		return err
	}
	cache, err := servercounter.NewCachedServerCounter(dnsCounter, servercounter.CacheConfig{Fallback: *fallback})
	if err != nil {
		return err
	}
	defer cache.Close()

	// The rich API waits for the first answer, as long as ctx lets it,
	// and says where the number came from.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cache.Count(ctx); err != nil {
		return err
	}

	// The simple API: a number, never an error, never a wait (before the
	// first answer, the fallback).
	var counter servercounter.ServerCounter = cache
	fmt.Println("servers:", counter.CountServers())

	res, err := cache.Count(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("source: %s, name: %s, ttl: %s\n", res.Source, res.Name, res.TTL)
	return nil
}
