package server

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/logtest"
)

// An event that touches thousands of peers at once (a network cut ending
// 5,000 agent streams) logs a burst of lines per kind, then a few a
// second, the next line saying how many were left out; another kind has
// a bound of its own.
func TestLinesOfAKindAreBounded(t *testing.T) {
	log, buf := logtest.NewLogger(0)
	var l logLimiter
	start := time.Now()
	for i := range 5000 {
		l.info(log, "ended/silent", "Ended the stream of an agent", "agentID", i)
	}
	l.error(log, "reject/unauthenticated", errors.New("bad token"), "Rejected agent stream")
	elapsed := time.Since(start)
	lines := strings.Count(buf.String(), "Ended the stream of an agent")
	// The bucket refills logPerSecond a second while the loop runs.
	assert.GreaterOrEqual(t, lines, logBurst)
	assert.LessOrEqual(t, float64(lines), logBurst+1+elapsed.Seconds()*logPerSecond, "lines for 5000 events in %v", elapsed)
	assert.Equal(t, 1, strings.Count(buf.String(), "Rejected agent stream"), "another kind is bounded apart")

	// Once the bucket has a token again, the next line says how many
	// were left out.
	require.Eventually(t, func() bool {
		ok, left := l.allow("ended/silent")
		return ok && left > 0
	}, 10*time.Second, 10*time.Millisecond)
}
