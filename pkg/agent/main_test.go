//go:debug netdns=go

// The directive above pins the pure Go resolver, which rejects malformed
// names such as "bad host" without sending a query (cgo's getaddrinfo
// might not): tests must never send a packet off loopback.

package agent

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
