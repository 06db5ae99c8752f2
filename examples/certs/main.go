// Command certs writes a CA and the certificates a local proxy-server,
// proxy-agent and frontend client need, for trying servercount on one
// machine (make certs). They are valid for a day and for localhost,
// 127.0.0.1 and ::1 only; never use them elsewhere.
//
//	go run ./examples/certs [DIR]   (default DIR: ./certs)
package main

import (
	"fmt"
	"os"

	"github.com/servercount/servercount/internal/pkitest"
)

func main() {
	dir := "certs"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	if err := write(dir); err != nil {
		fmt.Fprintln(os.Stderr, "certs:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := pkitest.NewCA("servercount-local-ca")
	if err != nil {
		return err
	}
	if _, err := ca.WriteFile(dir, "ca"); err != nil {
		return err
	}
	issue := []struct {
		name string
		pair func() (*pkitest.Pair, error)
	}{
		{"server", func() (*pkitest.Pair, error) { return ca.Server("proxy-server") }},
		{"agent", func() (*pkitest.Pair, error) { return ca.Client("proxy-agent") }},
		{"client", func() (*pkitest.Pair, error) { return ca.Client("kube-apiserver") }},
	}
	for _, i := range issue {
		p, err := i.pair()
		if err != nil {
			return err
		}
		if _, _, err := p.WriteFiles(dir, i.name); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %s/{ca.crt,server.crt,server.key,agent.crt,agent.key,client.crt,client.key}\n", dir)
	return nil
}
