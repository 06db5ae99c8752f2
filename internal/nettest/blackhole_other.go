//go:build !linux

package nettest

import "testing"

// Blackhole skips the test: only Linux is known to drop connects to a
// listener whose accept queue is full.
func Blackhole(t testing.TB) string {
	t.Skip("needs Linux to make a loopback address whose connects hang")
	return ""
}
