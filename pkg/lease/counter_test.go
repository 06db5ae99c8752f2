package lease_test

import (
	"encoding/json"
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

	"github.com/servercount/servercount/internal/kubeclient"
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
