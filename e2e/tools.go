//go:build tools

// Package e2e is the end-to-end suite; this file keeps the commands it
// builds (proxy-server, proxy-agent, servercount) in go.mod and go.sum.
package e2e

import (
	_ "github.com/servercount/servercount/cmd/proxy-agent"
	_ "github.com/servercount/servercount/cmd/proxy-server"
	_ "github.com/servercount/servercount/cmd/servercount"
)
