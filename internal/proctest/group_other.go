//go:build !unix

package proctest

import (
	"os"
	"syscall"
)

// sysProcAttr is the default: there are no process groups to make here.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup signals p alone: without process groups, its children are
// not reached.
func signalGroup(p *os.Process, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Signal(sig)
}
