package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/dnstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestLibraryExamplePrintsCount(t *testing.T) {
	srv := dnstest.NewServer(t)
	srv.SetRecords(dnstest.Headless("proxy.example.", "agent", "tcp", 8091, "10.0.0.1", "10.0.0.2")...)
	bin := filepath.Join(t.TempDir(), "library")
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	out, err = exec.CommandContext(t.Context(), bin, "--name", "proxy.example.", "--server", srv.Addr()).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "servers: 2\nsource: dns, name: proxy.example., ttl: 30s\n", string(out))

	out, err = exec.CommandContext(t.Context(), bin).CombinedOutput()
	require.Error(t, err)
	assert.Equal(t, "library: missing --name: give the DNS name of the servers' headless Service\n", string(out))
}
