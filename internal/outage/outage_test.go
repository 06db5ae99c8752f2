package outage

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestOutageLogsStartReminderAndEnd(t *testing.T) {
	logger, buf := logtest.NewLogger(0)
	clk := clocktest.New(time.Unix(1000, 0))
	o := New("connect to proxy-server", clk.Now)
	err := errors.New("connection refused")

	o.Recovered(logger) // nothing was failing: nothing to say
	assert.Empty(t, buf.String())
	for range 100 {
		o.Failed(logger, err, "serverAddress", "127.0.0.1:1")
		clk.Step(time.Second)
	}
	assert.Equal(t, 1, strings.Count(buf.String(), "Failed to connect to proxy-server"), buf.String())
	assert.Contains(t, buf.String(), `err="connection refused" serverAddress="127.0.0.1:1"`)

	clk.Step(DefaultRemind)
	o.Failed(logger, err)
	o.Failed(logger, err)
	assert.Equal(t, 1, strings.Count(buf.String(), "Still failing to connect to proxy-server"), buf.String())

	o.Recovered(logger)
	o.Recovered(logger)
	assert.Equal(t, 1, strings.Count(buf.String(), "Recovered: connect to proxy-server succeeded again"), buf.String())
	assert.Contains(t, buf.String(), "failures=102")

	clk.Step(DefaultQuiet)
	o.Failed(logger, err)
	assert.Equal(t, 2, strings.Count(buf.String(), "Failed to connect to proxy-server"), "a new failure is logged again")
}

// Attempts that fail and succeed in turn log one start and one end per
// DefaultQuiet, not a line per attempt.
func TestOutageFlappingIsRateLimited(t *testing.T) {
	logger, buf := logtest.NewLogger(0)
	clk := clocktest.New(time.Unix(1000, 0))
	o := New("connect to proxy-server", clk.Now)
	err := errors.New("x509: certificate signed by unknown authority")
	for range 50 {
		o.Failed(logger, err)
		clk.Step(100 * time.Millisecond)
		o.Recovered(logger)
		clk.Step(100 * time.Millisecond)
	}
	out := buf.String()
	assert.Equal(t, 1, strings.Count(out, "Failed to connect"), out)
	assert.Equal(t, 1, strings.Count(out, "Recovered"), out)

	// A failure that then persists is logged once the quiet time is over.
	for range 100 {
		o.Failed(logger, err)
		clk.Step(time.Second)
	}
	assert.Equal(t, 2, strings.Count(buf.String(), "Failed to connect"), buf.String())
}
