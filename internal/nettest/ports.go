package nettest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FreePorts returns n distinct loopback (127.0.0.1) TCP ports that were
// free a moment ago, and fails the test if it cannot find them.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports, err := FreePortsOn("127.0.0.1", n)
	require.NoError(tb, err)
	return ports
}

// FreePortsOn returns n distinct TCP ports on ip that were free a moment
// ago. It is FreePorts for callers that are not tests, such as the e2e
// harness and the demo.
func FreePortsOn(ip string, n int) ([]int, error) {
	ports := make([]int, 0, n)
	ls := make([]net.Listener, 0, n)
	// Every listener stays open until all n are found: closing one early
	// would let the next Listen hand out the same port again.
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("find a free port on %s: %w", ip, err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreeTCPUDPPortOn returns a port on ip that was free for both TCP and
// UDP a moment ago, for servers such as DNS servers that listen on both.
func FreeTCPUDPPortOn(ip string) (int, error) {
	// The kernel picks TCP ports only; the same number may be taken for
	// UDP, so try a few.
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return 0, fmt.Errorf("find a free port on %s: %w", ip, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(port)))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = u.Close()
		return port, nil
	}
	return 0, errors.New("find a free port: no port free for both TCP and UDP after 50 tries")
}

// RequireReleased fails tb unless every one of ports on 127.0.0.1 can be
// listened on again: whatever held them has let them go.
func RequireReleased(tb testing.TB, ports ...int) {
	tb.Helper()
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if !assert.NoError(tb, err, "port %d is still held", p) {
			continue
		}
		_ = l.Close()
	}
}
