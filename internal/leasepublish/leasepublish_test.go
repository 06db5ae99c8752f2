package leasepublish_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/leasepublish"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestFlags(t *testing.T) {
	parse := func(args ...string) *leasepublish.Options {
		o := leasepublish.NewOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		return o
	}
	o := parse()
	assert.False(t, o.Enabled)
	assert.Equal(t, "kube-system", o.Namespace)
	assert.Equal(t, "k8s-app=konnectivity-server", o.Labels)
	assert.Empty(t, parse("--enable-lease-controller", "--lease-label=a=b,c=d").Validate())
	errs := parse("--enable-lease-controller", "--lease-label=a", "--lease-namespace=").Validate()
	require.Len(t, errs, 2)
	assert.ErrorContains(t, errs[0], "--lease-namespace")
	assert.ErrorContains(t, errs[1], `invalid --lease-label "a"`)
}
