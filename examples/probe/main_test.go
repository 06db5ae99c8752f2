package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestProbeDemoRuns(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(t.Context(), &out))
	got := out.String()
	for _, want := range []string{
		";; COUNT: 3, outcome: records",
		"--short _agent._tcp." + svc + "\n5\n(exit status 0)",
		"outcome: nxdomain, rcode: NXDOMAIN",
		"(exit status 1)",
		"server answered SERVFAIL",
		"(exit status 2)",
		"cached count: 3\n",
	} {
		assert.Contains(t, got, want)
	}
	assert.Regexp(t, `after \d+ failed refreshes: 3\n`, got)
}
