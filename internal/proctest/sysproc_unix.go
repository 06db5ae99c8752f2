//go:build unix && !linux

package proctest

import "syscall"

// sysProcAttr puts the process in its own group, so that Stop reaches its
// children too. Only Linux has a parent death signal.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
