package proctest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/logtest"
)

// StopGrace is how long Stop waits after SIGTERM before it kills the
// process group.
const StopGrace = 10 * time.Second

// WaitTimeout bounds Wait: how long a test waits for a process it asked
// to exit.
const WaitTimeout = 20 * time.Second

// termSpacing separates the SIGTERMs of Stop: far enough apart that the
// process sees two signals, not one the Go runtime merged.
const termSpacing = 200 * time.Millisecond

// Process is a program started in its own process group. Its output
// (stdout and stderr together) goes to LogFile, or, without one, to memory.
type Process struct {
	*exec.Cmd

	// Name names the process in errors and logs.
	Name string
	// LogFile holds the process's output; empty when the output is kept
	// in memory.
	LogFile string
	// TermSignals is how many SIGTERMs, termSpacing apart, Stop sends
	// before it waits (a proxy-agent drains on the first and stops on the
	// second); 0 means 1. Set it before Stop.
	TermSignals int

	out  *logtest.Buffer // the output when LogFile is empty
	done chan struct{}   // closed once the process has exited and err is set

	mu   sync.Mutex // guards err
	err  error      // the Wait error, set before done is closed
	stop sync.Once
}

// Start runs bin with args, its output kept in memory, and kills its
// process group when the test ends: the process if it still runs, and any
// child it left. The output is shown if the test failed.
func Start(tb testing.TB, bin string, args ...string) *Process {
	tb.Helper()
	out := &logtest.Buffer{}
	p, err := start(filepath.Base(bin), "", out, nil, bin, args...)
	require.NoError(tb, err)
	p.out = out
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("%s output:\n%s", p.Name, p.Output())
		}
	})
	return p
}

// StartProcess starts bin with args, its output appended to logFile. The
// caller stops it, with Stop or Kill.
func StartProcess(name, logFile, bin string, args ...string) (*Process, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the log of %s: %w", name, err)
	}
	p, err := start(name, logFile, f, f, bin, args...)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return p, nil
}

// start starts bin writing to out, and closes closer, if any, once the
// process has exited.
func start(name, logFile string, out io.Writer, closer io.Closer, bin string, args ...string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &Process{Cmd: cmd, Name: name, LogFile: logFile, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if closer != nil {
			_ = closer.Close()
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id, which is also its process group id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

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
func (p *Process) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Wait waits up to WaitTimeout for the process to exit and returns its
// Wait error; it kills the process group and fails the test if the
// process does not exit.
func (p *Process) Wait(tb testing.TB) error {
	tb.Helper()
	select {
	case <-p.done:
	case <-time.After(WaitTimeout):
		tb.Errorf("%s did not exit within %v", p.Name, WaitTimeout)
		p.Kill()
	}
	_, err := p.Exited()
	return err
}

// Stop sends SIGTERM to the process group, then SIGKILL after StopGrace,
// and waits for the process to exit. It is safe to call more than once.
func (p *Process) Stop() { p.StopWithin(StopGrace) }

// StopWithin is Stop with another grace period.
func (p *Process) StopWithin(grace time.Duration) {
	p.stop.Do(func() {
		deadline := time.After(grace)
		for i := range max(p.TermSignals, 1) {
			if i > 0 {
				select {
				case <-p.done:
				case <-time.After(termSpacing):
				}
			}
			_ = signalGroup(p.Cmd.Process, syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-deadline:
		}
		p.killGroup()
	})
}

// Kill kills the process group at once and waits for the process. It is
// safe to call more than once, and after Stop.
func (p *Process) Kill() { p.stop.Do(p.killGroup) }

// killGroup kills whatever is left in the group, the leader included
// (children of an exited leader too), and waits for the leader.
func (p *Process) killGroup() {
	_ = signalGroup(p.Cmd.Process, syscall.SIGKILL)
	<-p.done
}

// Output returns what the process has written so far.
func (p *Process) Output() string {
	if p.out != nil {
		return p.out.String()
	}
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// Log returns the last max bytes of the process's output.
func (p *Process) Log(max int) string {
	s := p.Output()
	if len(s) > max {
		s = "...\n" + s[len(s)-max:]
	}
	return s
}
