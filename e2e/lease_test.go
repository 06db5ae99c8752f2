package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/pkg/lease"
)

// Short lease timings, so that expiry and collection happen within seconds.
const (
	leaseDuration = 4 * time.Second
	leaseRenew    = time.Second
	leaseGC       = time.Second
)

// TestLeaseCounterAndPublisher runs pkg/lease against the real API server:
// publishers create and renew leases that the counter counts; a graceful
// stop deletes its lease at once; a lease that is no longer renewed drops
// out when it expires and is collected; a lease without
// leaseDurationSeconds is not counted and breaks nothing.
func TestLeaseCounterAndPublisher(t *testing.T) {
	ctx := t.Context()
	const ns = "lease-library"
	client := the.cluster.Client
	require.NoError(t, harness.CreateNamespace(ctx, client, ns))

	counter, err := lease.NewCounter(lease.CounterConfig{Client: client.CoordinationV1().Leases(ns)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = counter.Close() })
	countIs := func(want int, within time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool {
			res, err := counter.Count(ctx)
			return err == nil && res.Count == want
		}, within, 10*time.Millisecond, "%s: count %d", what, want)
		return time.Since(start)
	}
	require.NoError(t, counter.WaitSynced(ctx), "the first list ends")
	res, err := counter.Count(ctx)
	require.NoError(t, err, "the first list ends")
	assert.Zero(t, res.Count, "no lease yet")

	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	publish := func(id string) context.CancelFunc {
		p, err := lease.NewPublisher(lease.PublisherConfig{Client: client.CoordinationV1().Leases(ns), ServerID: id,
			Duration: leaseDuration, RenewInterval: leaseRenew, GCInterval: leaseGC})
		require.NoError(t, err)
		pctx, cancel := context.WithCancel(ctx)
		wg.Go(func() { _ = p.Run(pctx) })
		t.Cleanup(cancel)
		return cancel
	}
	stops := map[string]context.CancelFunc{}
	for _, id := range []string{"s1", "s2", "s3"} {
		start := time.Now()
		stops[id] = publish(id)
		if id == "s1" {
			countIs(1, 10*time.Second, "first lease")
			t.Logf("first lease counted %.2fs after its publisher started", time.Since(start).Seconds())
		}
	}
	countIs(3, 10*time.Second, "three publishers")
	l, err := client.CoordinationV1().Leases(ns).Get(ctx, "konnectivity-proxy-server-s1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "s1", *l.Spec.HolderIdentity)
	assert.Equal(t, int32(4), *l.Spec.LeaseDurationSeconds)
	assert.Equal(t, "konnectivity-server", l.Labels["k8s-app"])

	// A graceful stop deletes the lease: counted out well before expiry.
	stops["s3"]()
	d := countIs(2, leaseDuration/2, "graceful stop")
	t.Logf("a gracefully stopped server left the count %.2fs after its stop", d.Seconds())

	// A lease without leaseDurationSeconds is invalid; the next lease
	// proves the counter has seen it.
	now := metav1.NewMicroTime(time.Now())
	leases := client.CoordinationV1().Leases(ns)
	_, err = leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "konnectivity-proxy-server-noduration", Labels: map[string]string{"k8s-app": "konnectivity-server"}},
		Spec:       coordinationv1.LeaseSpec{RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// A server killed without a graceful stop: its lease is renewed no more.
	killedAt := time.Now()
	renewed := metav1.NewMicroTime(killedAt)
	secs := int32(leaseDuration / time.Second)
	_, err = leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "konnectivity-proxy-server-killed", Labels: map[string]string{"k8s-app": "konnectivity-server"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed"), LeaseDurationSeconds: &secs, RenewTime: &renewed, AcquireTime: &renewed},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	countIs(3, 10*time.Second, "the killed server's last lease, not the one without a duration")

	expiry := killedAt.Add(leaseDuration)
	countIs(2, 2*leaseDuration, "the killed server's lease expired")
	t.Logf("an expired lease left the count %.2fs after its expiry", time.Since(expiry).Seconds())
	require.Eventually(t, func() bool {
		_, err := leases.Get(ctx, "konnectivity-proxy-server-killed", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 3*leaseGC+leaseDuration, 50*time.Millisecond, "the expired lease is collected")

	// The renewed leases outlive several durations.
	assert.Never(t, func() bool {
		res, err := counter.Count(ctx)
		return err != nil || res.Count != 2
	}, leaseDuration+leaseRenew, 100*time.Millisecond, "renewed leases stay valid")
}
