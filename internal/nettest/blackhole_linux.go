// Package nettest holds network fixtures for tests: addresses and
// servers that misbehave the way real networks do.
package nettest

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Blackhole returns a loopback address whose TCP connects hang: a socket
// listening with a backlog of 0 that never accepts, whose accept queue is
// filled at once. Linux drops the SYNs of further connects, so they wait
// until their own timeout, without a packet leaving the machine.
func Blackhole(t testing.TB) string { return BlackholeAt(t, "127.0.0.1") }

// BlackholeAt is Blackhole on host, an IPv4 loopback address (any of
// 127.0.0.0/8, so that a test can order it among others).
func BlackholeAt(t testing.TB, host string) string {
	t.Helper()
	ip := net.ParseIP(host).To4()
	require.True(t, ip != nil && ip.IsLoopback(), "BlackholeAt needs an IPv4 loopback host, got %q", host)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte(ip)}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := net.JoinHostPort(host, strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the accept queue until a connect times out.
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "filling the accept queue of %s: %v", addr, err)
			return addr
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("connects to %s never hung: cannot make a blackhole address", addr)
	return ""
}

// Refused returns an address on the IPv4 loopback host whose TCP connects
// are refused: a socket bound to a free port that never listens. Holding
// the port keeps it refused for the whole test; a port merely closed
// after a listen can be taken by any listener the test (or a test beside
// it) starts next, and then answers.
func Refused(t testing.TB, host string) string {
	t.Helper()
	ip := net.ParseIP(host).To4()
	require.NotNil(t, ip, "Refused needs an IPv4 host, got %q", host)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte(ip)}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return net.JoinHostPort(host, strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
