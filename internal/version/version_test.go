package version_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/version"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestInfo(t *testing.T) {
	i := version.Get()
	assert.NotEmpty(t, i.Version)
	assert.Equal(t, runtime.Version(), i.GoVersion)
	assert.True(t, strings.HasPrefix(i.String(), i.Version+" (commit "), i.String())

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(i.Collector()))
	v, ok := metricstest.Value(reg, "servercount_build_info", "version", i.Version, "goversion", i.GoVersion)
	require.True(t, ok)
	assert.Equal(t, 1.0, v)
}
