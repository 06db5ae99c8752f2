// Package harness runs a real control plane (etcd, kube-apiserver and
// CoreDNS with its kubernetes plugin) and our proxy-servers and agents as
// local processes on loopback, for the end-to-end suite.
//
// Every process runs in its own process group, with SIGKILL as its parent
// death signal, and is stopped (the whole group) by Close/Stop or by the
// test's cleanup, also when a test fails.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StopTimeout is how long Stop waits after SIGTERM before it kills the
// process group.
const StopTimeout = 10 * time.Second

// Process is a program the harness started, in its own process group, with
// its output in a log file.
type Process struct {
	// Name names the process in errors and logs.
	Name string
	// LogFile holds the process's stdout and stderr.
	LogFile string

	// TermSignals is how many SIGTERMs, 200ms apart, Stop sends before it
	// waits (a proxy-agent drains on the first and stops on the second);
	// 0 means 1. Set it before Stop.
	TermSignals int

	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and err is set

	mu   sync.Mutex // guards err
	err  error      // the Wait error, set before done is closed
	stop sync.Once
}

// StartProcess starts bin with args, its output appended to logFile.
func StartProcess(name, logFile, bin string, args ...string) (*Process, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &Process{Name: name, LogFile: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id, which is also its process group id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited, and its Wait error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM to the process group, then SIGKILL after StopTimeout,
// and waits for the process to exit. It is safe to call more than once.
func (p *Process) Stop() {
	p.StopWithin(StopTimeout)
}

// StopWithin is Stop with another grace period.
func (p *Process) StopWithin(grace time.Duration) {
	p.stop.Do(func() {
		pgid := p.cmd.Process.Pid
		deadline := time.After(grace)
		for i := range max(p.TermSignals, 1) {
			if i > 0 {
				select {
				case <-p.done:
				case <-time.After(200 * time.Millisecond):
				}
			}
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-deadline:
		}
		// Kill whatever is left in the group, the leader included.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	})
}

// Kill kills the process group at once and waits for the process.
func (p *Process) Kill() { p.StopWithin(0) }

// Log returns the last max bytes of the process's output.
func (p *Process) Log(max int) string {
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// Binaries are the programs of the control plane.
type Binaries struct {
	Etcd, KubeAPIServer, Kubectl, CoreDNS string
}

// FindBinaries runs script (e2e/hack/binaries.sh), which builds and caches
// kube-apiserver, kubectl and CoreDNS once and prints the cache directory, and
// returns their paths. Versions come from KUBE_VERSION and COREDNS_VERSION
// as in the script.
func FindBinaries(script string) (Binaries, error) {
	cmd := exec.Command("bash", script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("run %s to build the control plane binaries: %w", script, err)
	}
	cache := strings.TrimSpace(string(out))
	kube, dns := os.Getenv("KUBE_VERSION"), os.Getenv("COREDNS_VERSION")
	if kube == "" {
		kube = "v1.37.2"
	}
	if dns == "" {
		dns = "v1.15.0"
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		return Binaries{}, fmt.Errorf("find etcd (apt-get install etcd-server): %w", err)
	}
	b := Binaries{
		Etcd:          etcd,
		KubeAPIServer: filepath.Join(cache, "bin", "kube-apiserver-"+kube),
		Kubectl:       filepath.Join(cache, "bin", "kubectl-"+kube),
		CoreDNS:       filepath.Join(cache, "bin", "coredns-"+dns),
	}
	for _, f := range []string{b.KubeAPIServer, b.Kubectl, b.CoreDNS} {
		if _, err := os.Stat(f); err != nil {
			return Binaries{}, fmt.Errorf("%s did not leave %s: %w", script, f, err)
		}
	}
	return b, nil
}

// waitFor polls ready every 100ms until it returns nil, the process exits,
// or timeout passes.
func waitFor(p *Process, timeout time.Duration, what string, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = ready(); last == nil {
			return nil
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited (%v) before %s; its log:\n%s", p.Name, err, what, p.Log(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not %s within %s: %w; its log:\n%s", p.Name, what, timeout, last, p.Log(4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
