package nettest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
	// Every listener stays open until all n are found, so that the n are
	// distinct.
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	err := drawPorts(ip, func(port string) (bool, error) {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			return false, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		return len(ports) == n, nil
	})
	return ports, err
}

// FreeTCPUDPPortOn returns a port on ip that was free for both TCP and
// UDP a moment ago, for servers such as DNS servers that listen on both.
func FreeTCPUDPPortOn(ip string) (int, error) {
	var port int
	err := drawPorts(ip, func(p string) (bool, error) {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, p))
		if err != nil {
			return false, err
		}
		defer l.Close()
		u, err := net.ListenPacket("udp", l.Addr().String())
		if err != nil {
			return false, err
		}
		_ = u.Close()
		port = l.Addr().(*net.TCPAddr).Port
		return true, nil
	})
	return port, err
}

// drawPorts offers take ports on ip, drawn at random below the kernel's
// ephemeral range, until take says it has enough. Not from that range: a
// port from it, free a moment ago, can become the local end of any
// connection the machine opens before the server it was meant for binds
// it, and on a busy CI machine one does. Drawn at random, test
// processes running at once rarely draw the same one. Where the range
// leaves too little room below it, the kernel picks (port "0"). take
// returns why a port would not do; the last reason is in the error when
// none did.
func drawPorts(ip string, take func(port string) (done bool, err error)) error {
	const lowest = 10000
	highest := ephemeralLow() - 1
	var last error
	for range 1000 {
		port := "0"
		if highest-lowest > 1000 {
			port = strconv.Itoa(lowest + rand.IntN(highest-lowest+1))
		}
		done, err := take(port)
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
	}
	return fmt.Errorf("find free ports on %s: none left after 1000 tries, the last refused with: %w", ip, last)
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), or Linux's default where it cannot be
// read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
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
