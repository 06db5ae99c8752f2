// Command pause is the sandbox image's only program for `make
// cluster-e2e`: the node pulls nothing, so the pause image is built here.
// It holds the pod's namespaces until it is told to stop, and reaps the
// zombies a shared PID namespace leaves with it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
