package tunnelbench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// schedCounts are what one process's goroutines did over an execution
// trace, counted from its scheduler's state transitions.
type schedCounts struct {
	wakeups  int // a blocked goroutine made runnable: a hand-off to it
	created  int // goroutines started
	syscalls int // system calls entered
}

// countSched reads the execution trace in file with go tool trace's
// parsed dump (the runtime's own parser: no trace library to vendor) and
// counts its goroutines' state transitions.
func countSched(ctx context.Context, file string) (schedCounts, error) {
	var c schedCounts
	cmd := exec.CommandContext(ctx, "go", "tool", "trace", "-d=parsed", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return c, err
	}
	if err := cmd.Start(); err != nil {
		return c, fmt.Errorf("go tool trace %s: %w", file, err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "M=") || !strings.Contains(line, " StateTransition ") || !strings.Contains(line, " GoID=") {
			continue
		}
		switch {
		case strings.Contains(line, " Waiting->Runnable "):
			c.wakeups++
		case strings.Contains(line, " NotExist->Runnable "):
			c.created++
		case strings.Contains(line, " Running->Syscall "):
			c.syscalls++
		}
	}
	scanErr := sc.Err()
	if err := cmd.Wait(); err != nil {
		return c, fmt.Errorf("go tool trace -d=parsed %s: %w", file, err)
	}
	if scanErr != nil {
		return c, fmt.Errorf("read go tool trace's dump of %s: %w", file, scanErr)
	}
	if c == (schedCounts{}) {
		return c, fmt.Errorf("go tool trace -d=parsed %s: no goroutine state transitions in its dump (has its format changed?)", file)
	}
	return c, nil
}

// schedTable is the hand-offs per new tunnel of each process, ours and
// upstream's, from the execution traces in dir of about dials[p] new
// tunnels through each pair p.
func schedTable(b *testing.B, pairs []*pair, dials map[*pair]int, dir string) string {
	b.Helper()
	var s strings.Builder
	s.WriteString("Per new tunnel, from execution traces of each process over several hundred dials (go tool trace's scheduler transitions over the dials made while it ran):\n\n")
	s.WriteString("| mode | process | goroutine wake-ups | goroutines started | system calls |\n| --- | --- | --- | --- | --- |\n")
	for _, p := range pairs {
		for _, role := range []string{"server", "agent"} {
			file := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.trace", p.impl, p.name, role))
			c, err := countSched(b.Context(), file)
			if err != nil {
				b.Fatal(err)
			}
			n := float64(max(dials[p], 1)) // at least the dial that ran while the trace ended
			whose := map[string]string{"ours": "our", "upstream": "upstream's"}[p.impl]
			fmt.Fprintf(&s, "| %s | %s %s | %.1f | %.1f | %.1f |\n", p.name, whose, role, float64(c.wakeups)/n, float64(c.created)/n, float64(c.syscalls)/n)
		}
	}
	return s.String()
}
