//go:build unix

package proctest_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/proctest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func sh(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	return bin
}

func TestStartKeepsOutputAndExitError(t *testing.T) {
	p := proctest.Start(t, sh(t), "-c", "echo out; echo err >&2; exit 3")
	var exit *exec.ExitError
	require.ErrorAs(t, p.Wait(t), &exit)
	assert.Equal(t, 3, exit.ExitCode())
	assert.Equal(t, "out\nerr\n", p.Output())
	exited, err := p.Exited()
	assert.True(t, exited)
	assert.ErrorAs(t, err, &exit)
}

// childPid starts, under sh, a child that outlives a SIGTERM to sh alone,
// and returns the process and the child's pid once sh has printed it.
func childPid(t *testing.T, p *proctest.Process) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		line, _, ok := strings.Cut(p.Output(), "\n")
		if !ok {
			return false
		}
		var err error
		pid, err = strconv.Atoi(line)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "no pid from sh: %q", p.Output())
	return pid
}

// gone reports whether pid no longer runs: it does not exist, or, where
// /proc tells, it is a zombie its new parent has yet to reap.
func gone(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	_, rest, ok := strings.Cut(string(stat), ") ")
	return ok && strings.HasPrefix(rest, "Z")
}

// Stop reaches the whole process group, and the output goes to the log.
func TestStopEndsTheGroupAndLogsToAFile(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sh.log")
	p, err := proctest.StartProcess("sh", log, sh(t), "-c", "sleep 600 & echo $!; wait")
	require.NoError(t, err)
	child := childPid(t, p)
	p.StopWithin(5 * time.Second)
	exited, _ := p.Exited()
	assert.True(t, exited)
	require.Eventually(t, func() bool { return gone(child) }, 10*time.Second, 10*time.Millisecond, "the child outlived Stop")
	assert.Equal(t, strconv.Itoa(child)+"\n", p.Log(100))
	p.Kill() // after Stop: a no-op
}

// Kill kills at once, SIGTERM ignored, children included.
func TestKillIgnoresTraps(t *testing.T) {
	p := proctest.Start(t, sh(t), "-c", "trap '' TERM; sleep 600 & echo $!; wait")
	child := childPid(t, p)
	p.Kill()
	<-p.Done()
	require.Eventually(t, func() bool { return gone(child) }, 10*time.Second, 10*time.Millisecond, "the child outlived Kill")
}
