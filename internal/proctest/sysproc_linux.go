package proctest

import "syscall"

// sysProcAttr puts the process in its own group, so that Stop reaches its
// children too, and has Linux kill it when the test binary dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
