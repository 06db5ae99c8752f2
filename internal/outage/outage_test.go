package outage

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newOutage returns an outage of connecting to proxy-server on a manual
// clock, with the logger to report it to and what that logs.
func newOutage() (*Outage, *clocktest.Clock, klog.Logger, *logtest.Buffer) {
	clk := clocktest.New(time.Unix(1000, 0))
	logger, buf := logtest.NewLogger(0)
	return New("connect to proxy-server", clk), clk, logger, buf
}

func TestOutageLogsStartReminderAndEnd(t *testing.T) {
	o, clk, logger, buf := newOutage()
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
	o, clk, logger, buf := newOutage()
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
