package app_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/servercount/servercount/cmd/servercount/app"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/pkg/lease"
)

// leaseAPI answers the Lease list of kube-system as the API server does:
// two renewed leases, one that expired an hour ago and one without a
// duration; a watch waits until the client leaves. With status set it
// answers that instead.
func leaseAPI(t *testing.T, status int) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if status != 0 {
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(status), Reason: metav1.StatusReasonForbidden, Message: "leases is forbidden"})
			return
		}
		if r.URL.Query().Get("watch") == "true" {
			<-r.Context().Done()
			return
		}
		now, old := metav1.NewMicroTime(time.Now()), metav1.NewMicroTime(time.Now().Add(-time.Hour))
		item := func(name string, renew *metav1.MicroTime, d *int32) coordinationv1.Lease {
			return coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: lease.NamePrefix + name, Namespace: "kube-system", ResourceVersion: "7"},
				Spec:       coordinationv1.LeaseSpec{RenewTime: renew, LeaseDurationSeconds: d},
			}
		}
		_ = json.NewEncoder(w).Encode(&coordinationv1.LeaseList{
			TypeMeta: metav1.TypeMeta{Kind: "LeaseList", APIVersion: "coordination.k8s.io/v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "7"},
			Items: []coordinationv1.Lease{
				item("a", &now, ptr.To[int32](30)), item("b", &now, ptr.To[int32](30)),
				item("expired", &old, ptr.To[int32](30)), item("no-duration", &now, nil),
			},
		})
	}))
	t.Cleanup(srv.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, kubeclient.WriteKubeconfig(kubeconfig, srv.URL, "t"))
	return kubeconfig
}

// --leases counts what an agent with --count-server-leases counts: the
// renewed leases with a duration, not the expired one.
func TestLeasesCountsValidLeases(t *testing.T) {
	kubeconfig := leaseAPI(t, 0)
	code, out, errOut := run(t, "--leases", "--kubeconfig", kubeconfig)
	assert.Equal(t, app.ExitOK, code, errOut)
	assert.Contains(t, out, ";; COUNT: 2, source: leases")

	code, out, _ = run(t, "--leases", "--kubeconfig", kubeconfig, "--short")
	assert.Equal(t, app.ExitOK, code)
	assert.Equal(t, "2\n", out)

	code, out, _ = run(t, "--leases", "--kubeconfig", kubeconfig, "--json")
	assert.Equal(t, app.ExitOK, code)
	var r struct {
		Source string
		Count  *int
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.Equal(t, "leases", r.Source)
	require.NotNil(t, r.Count)
	assert.Equal(t, 2, *r.Count)
}

// An API server that refuses the list leaves the count unknown: exit 2
// within the bound, with the reason; --json says count null.
func TestLeasesUnknownWhenTheAPIRefuses(t *testing.T) {
	kubeconfig := leaseAPI(t, http.StatusForbidden)
	code, _, errOut := run(t, "--leases", "--kubeconfig", kubeconfig, "--timeout=500ms", "--attempts=1")
	assert.Equal(t, app.ExitError, code)
	assert.Contains(t, errOut, "no list of the Leases in kube-system")

	code, out, _ := run(t, "--leases", "--kubeconfig", kubeconfig, "--timeout=500ms", "--attempts=1", "--json")
	assert.Equal(t, app.ExitError, code)
	assert.Contains(t, out, `"count":null`)
}

// --leases takes no DNS name, and no --watch.
func TestLeasesUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--leases", "proxy-server.example."},
		{"--leases", "@127.0.0.1"},
		{"--leases", "--watch"},
		{"--leases", "--lease-label-selector", "a in (b"},
	} {
		code, _, errOut := run(t, args...)
		assert.Equal(t, app.ExitUsage, code, "%v: %s", args, errOut)
	}
}
