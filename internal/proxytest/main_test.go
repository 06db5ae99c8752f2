//go:debug netdns=go

// The directive above pins the pure Go resolver, which rejects a malformed
// name such as "bad host" without sending a query (cgo's getaddrinfo might
// not): these tests must never send a packet off loopback.

package proxytest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
