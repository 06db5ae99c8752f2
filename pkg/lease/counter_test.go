package lease_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/lease"
)

// leaseAPI is an API server for the Leases of one namespace, enough for
// a Counter: each list answers one valid lease, and each watch ends with
// 410 Expired, as a restarted kube-apiserver answers a watch from before
// its restart. Watches, and lists after the first, wait until the test
// lets them through.
type leaseAPI struct {
	lists   atomic.Int32
	watch   chan struct{} // lets a watch through
	release chan struct{} // lets a list after the first through
}

func (a *leaseAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("watch") == "true" {
		select {
		case <-a.watch:
		case <-r.Context().Done():
			return
		}
		status := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 10 (12)"}
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "ERROR", "object": status})
		return
	}
	if a.lists.Add(1) > 1 {
		select {
		case <-a.release:
		case <-r.Context().Done():
			return
		}
	}
	now := metav1.NewMicroTime(time.Now())
	list := coordinationv1.LeaseList{
		TypeMeta: metav1.TypeMeta{Kind: "LeaseList", APIVersion: "coordination.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "10"},
		Items: []coordinationv1.Lease{{
			ObjectMeta: metav1.ObjectMeta{Name: lease.NamePrefix + "a", Namespace: "ns", ResourceVersion: "10"},
			Spec:       coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: &now},
		}},
	}
	_ = json.NewEncoder(w).Encode(&list)
}

// A watch that the API server ends with an error (410 Expired after it
// restarted) leaves the count unknown until the informer has listed
// again: the informer waits its back-off before that list, up to a minute
// after an outage, and sees no renewal in between, so the leases it holds
// must not be counted down as they expire.
func TestCountUnknownFromAWatchErrorUntilTheNextList(t *testing.T) {
	api := &leaseAPI{watch: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(api)
	defer srv.Close()
	defer close(api.release)
	defer close(api.watch)
	client, err := kubeclient.NewLeases(&rest.Config{Host: srv.URL}, "ns")
	require.NoError(t, err)
	c, err := lease.NewCounter(lease.CounterConfig{Client: client})
	require.NoError(t, err)
	defer c.Close()

	require.NoError(t, c.WaitSynced(t.Context()), "the first list")
	res, err := c.Count(t.Context())
	require.NoError(t, err, "the first list")
	assert.Equal(t, 1, res.Count)
	api.watch <- struct{}{}
	require.Eventually(t, func() bool {
		_, err := c.Count(t.Context())
		return err != nil
	}, 20*time.Second, 5*time.Millisecond, "count unknown once the watch ended with 410")
	_, err = c.Count(t.Context())
	assert.ErrorContains(t, err, "too old resource version")

	api.release <- struct{}{} // the informer's next list
	require.Eventually(t, func() bool {
		res, err := c.Count(t.Context())
		return err == nil && res.Count == 1
	}, 20*time.Second, 5*time.Millisecond, "count known again after the list")
}

// manyLeases serves a list of n valid leases, renewed at random moments
// of the minute before now, and watches that wait for the test's end.
func manyLeases(tb testing.TB, n int, now time.Time) string {
	tb.Helper()
	rng := rand.New(rand.NewPCG(uint64(n), 21))
	list := coordinationv1.LeaseList{
		TypeMeta: metav1.TypeMeta{Kind: "LeaseList", APIVersion: "coordination.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "10"},
	}
	for i := range n {
		renewed := metav1.NewMicroTime(now.Add(-time.Duration(rng.Int64N(int64(time.Minute)))))
		list.Items = append(list.Items, coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(lease.NamePrefix, i), Namespace: "ns", ResourceVersion: "10",
				Labels: map[string]string{"k8s-app": "konnectivity-server"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(fmt.Sprint("server-", i)), LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: &renewed, AcquireTime: &renewed},
		})
	}
	body, err := json.Marshal(&list)
	require.NoError(tb, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			<-r.Context().Done()
			return
		}
		_, _ = w.Write(body)
	}))
	tb.Cleanup(srv.Close)
	tb.Cleanup(srv.CloseClientConnections)
	return srv.URL
}

// armCounter is a clock that counts the timers armed on it.
type armCounter struct {
	*clocktest.Clock
	armed atomic.Int64
}

func (c *armCounter) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.armed.Add(1)
	return c.Clock.AfterFunc(d, f)
}

// The counter's work per informer event does not grow with the
// number of leases. It once walked every lease and re-armed its expiry
// timer on every event, so the first list of 16,000 leases took 4.4 s.
// Now the soonest expiry is kept in a heap, and the timer is armed again
// only when it changes: a few dozen times for 16,000 leases in random
// order, against once per lease before.
func TestFirstListWorkIsNotQuadratic(t *testing.T) {
	const n = 16000
	now := time.Now()
	clk := &armCounter{Clock: clocktest.New(now)}
	client, err := kubeclient.NewLeases(&rest.Config{Host: manyLeases(t, n, now)}, "ns")
	require.NoError(t, err)
	c, err := lease.NewCounter(lease.CounterConfig{Client: client, Clock: clk})
	require.NoError(t, err)
	defer c.Close()

	require.NoError(t, c.WaitSynced(t.Context()))
	res, err := c.Count(t.Context())
	require.NoError(t, err)
	assert.Equal(t, n, res.Count)
	assert.Less(t, clk.armed.Load(), int64(200), "the expiry timer was armed again on nearly every event")

	// They all expire together an hour after the latest renewal.
	clk.Step(time.Hour + time.Minute)
	require.Eventually(t, func() bool {
		res, err := c.Count(t.Context())
		return err == nil && res.Count == 0
	}, 10*time.Second, time.Millisecond)
}

// BenchmarkFirstList measures the first list of many leases, from
// NewCounter to the first count, per lease: with work per event that does
// not grow with the leases, 16,000 cost no more per lease than 1,000.
func BenchmarkFirstList(b *testing.B) {
	for _, n := range []int{1000, 16000} {
		b.Run(fmt.Sprint("leases=", n), func(b *testing.B) {
			url := manyLeases(b, n, time.Now())
			client, err := kubeclient.NewLeases(&rest.Config{Host: url, QPS: 1e6, Burst: 1e6}, "ns")
			require.NoError(b, err)
			for b.Loop() {
				c, err := lease.NewCounter(lease.CounterConfig{Client: client})
				require.NoError(b, err)
				require.NoError(b, c.WaitSynced(b.Context()))
				res, err := c.Count(b.Context())
				require.NoError(b, err)
				require.Equal(b, n, res.Count)
				require.NoError(b, c.Close())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/lease")
		})
	}
}
