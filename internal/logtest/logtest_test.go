package logtest_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestLoggerKeepsItsLevel(t *testing.T) {
	logger, buf := logtest.NewLogger(2)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { logger.V(2).Info("shown", "i", i) })
	}
	wg.Wait()
	logger.V(3).Info("hidden")
	assert.Equal(t, 4, strings.Count(buf.String(), `"shown"`))
	assert.NotContains(t, buf.String(), "hidden")
}

// A capture sees what was written while its test ran, and nothing after.
func TestTeeCapturesUntilTheTestEnds(t *testing.T) {
	var out logtest.Buffer
	tee := logtest.NewTee(&out)
	var captured *logtest.Buffer
	t.Run("capturing", func(t *testing.T) {
		captured = tee.Capture(t)
		_, _ = tee.Write([]byte("during\n"))
	})
	_, _ = tee.Write([]byte("after\n"))
	assert.Equal(t, "during\n", captured.String())
	assert.Equal(t, "during\nafter\n", out.String())
}
