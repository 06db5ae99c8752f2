//go:build !linux

package netnstest

import "errors"

var errLinuxOnly = errors.New("network namespaces are Linux only")

// Inside reports whether this process is the one Reexec started with
// marker; elsewhere than Linux, never.
func Inside(marker string) bool { return false }

// Reexec fails: network namespaces are Linux only.
func Reexec(marker string, env ...string) (int, error) { return 1, errLinuxOnly }

// Up fails: network namespaces are Linux only.
func Up(marker string, prefixes ...string) error { return errLinuxOnly }

// Void fails: network namespaces are Linux only.
func Void(marker, prefix string) error { return errLinuxOnly }

// Routes fails: network namespaces are Linux only.
func Routes() (string, error) { return "", errLinuxOnly }

// NoNames fails: network namespaces are Linux only.
func NoNames(marker string) error { return errLinuxOnly }
