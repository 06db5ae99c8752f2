//go:build !linux

package nettest

import (
	"net"
	"testing"
)

// Blackhole skips the test: only Linux is known to drop connects to a
// listener whose accept queue is full.
func Blackhole(t testing.TB) string {
	t.Skip("needs Linux to make a loopback address whose connects hang")
	return ""
}

// Refused returns an address on host where nothing listens: a port that
// was free a moment ago (elsewhere than Linux, it is not held).
func Refused(t testing.TB, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// BlackholeAt skips the test, as Blackhole does.
func BlackholeAt(t testing.TB, host string) string { return Blackhole(t) }
