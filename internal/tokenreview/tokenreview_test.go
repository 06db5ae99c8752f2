package tokenreview_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/tokenreview"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// client-go's shared HTTP transports keep idle-connection reapers.
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// apiServer answers TokenReviews over HTTPS the way kube-apiserver does,
// from a table of known tokens; the e2e suite runs the real one.
func apiServer(t *testing.T, tokens map[string]authenticationv1.TokenReviewStatus) string {
	t.Helper()
	return newReviewServer(t, tokens).kubeconfig
}

// reviewServer is apiServer with its counts, and a gate that holds every
// review until the test opens it.
type reviewServer struct {
	kubeconfig string
	reviews    atomic.Int32
	inFlight   atomic.Int32
	maxFlight  atomic.Int32
	gate       chan struct{} // nil: no gate
	failing    atomic.Bool   // answer 500
}

func newReviewServer(t *testing.T, tokens map[string]authenticationv1.TokenReviewStatus) *reviewServer {
	t.Helper()
	rs := &reviewServer{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		rs.reviews.Add(1)
		n := rs.inFlight.Add(1)
		defer rs.inFlight.Add(-1)
		for m := rs.maxFlight.Load(); n > m && !rs.maxFlight.CompareAndSwap(m, n); m = rs.maxFlight.Load() {
		}
		if rs.gate != nil {
			select {
			case <-rs.gate:
			case <-r.Context().Done():
				return
			}
		}
		if rs.failing.Load() {
			http.Error(w, "etcd is down", http.StatusInternalServerError)
			return
		}
		// client-go sends protobuf; the scheme's codecs read it as the
		// API server would.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review authenticationv1.TokenReview
		if _, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, &review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		review.APIVersion, review.Kind = "authentication.k8s.io/v1", "TokenReview"
		review.Status = tokens[review.Spec.Token]
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(srv.CloseClientConnections)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: proxy-server}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL)), 0o600))
	rs.kubeconfig = kubeconfig
	return rs
}

func TestAuthenticateToken(t *testing.T) {
	agent := authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}
	kubeconfig := apiServer(t, map[string]authenticationv1.TokenReviewStatus{
		"good":      {Authenticated: true, User: agent, Audiences: []string{"system:konnectivity-server"}},
		"other-aud": {Authenticated: true, User: agent, Audiences: []string{"https://kubernetes.default.svc"}},
		"other-sa":  {Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:default"}, Audiences: []string{"system:konnectivity-server"}},
		"expired":   {Authenticated: false, Error: "token has expired"},
	})
	a, err := tokenreview.New(tokenreview.Config{Kubeconfig: kubeconfig, Audience: "system:konnectivity-server", Namespace: "kube-system", ServiceAccount: "konnectivity-agent"})
	require.NoError(t, err)
	tests := []struct {
		token   string
		wantErr string
	}{
		{token: "good"},
		{token: "other-aud", wantErr: `agent token not for audience "system:konnectivity-server"`},
		{token: "other-sa", wantErr: "agent token is system:serviceaccount:default:default's, not system:serviceaccount:kube-system:konnectivity-agent's"},
		{token: "expired", wantErr: "agent token not valid: token has expired"},
		{token: "unknown", wantErr: "agent token not valid: the API server gave no reason"},
	}
	for _, tc := range tests {
		t.Run(tc.token, func(t *testing.T) {
			err := a.AuthenticateToken(t.Context(), tc.token)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestNewNeedsTheServiceAccount(t *testing.T) {
	_, err := tokenreview.New(tokenreview.Config{Namespace: "kube-system"})
	assert.ErrorContains(t, err, "set --agent-namespace and --agent-service-account")
}

var (
	agentUser = authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:konnectivity-agent"}
	audience  = []string{"system:konnectivity-server"}
)

func newCached(t *testing.T, rs *reviewServer, mod func(*tokenreview.Config)) (*tokenreview.Authenticator, *clocktest.Clock, *prometheus.Registry) {
	t.Helper()
	clk := clocktest.New(time.Now())
	reg := prometheus.NewRegistry()
	cfg := tokenreview.Config{Kubeconfig: rs.kubeconfig, Audience: audience[0], Namespace: "kube-system", ServiceAccount: "konnectivity-agent",
		Clock: clk, Registerer: reg, CacheTTL: time.Minute, DenialTTL: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	a, err := tokenreview.New(cfg)
	require.NoError(t, err)
	return a, clk, reg
}

// jwt returns a token shaped as a service-account JWT expiring at exp.
func jwt(exp time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d,"sub":"system:serviceaccount:kube-system:konnectivity-agent"}`, exp.Unix()))
	return "eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln"
}

func TestCacheReusesVerdicts(t *testing.T) {
	long := jwt(time.Now().Add(time.Hour))
	// short expires 20s after the point where the test uses it, which
	// comes after the clock has moved 71s.
	short := jwt(time.Now().Add(91 * time.Second))
	rs := newReviewServer(t, map[string]authenticationv1.TokenReviewStatus{
		long:  {Authenticated: true, User: agentUser, Audiences: audience},
		short: {Authenticated: true, User: agentUser, Audiences: audience},
		"bad": {Authenticated: false, Error: "token has expired"},
	})
	a, clk, reg := newCached(t, rs, nil)
	ctx := t.Context()

	for range 5 {
		require.NoError(t, a.AuthenticateToken(ctx, long))
		require.ErrorContains(t, a.AuthenticateToken(ctx, "bad"), "token has expired")
	}
	assert.Equal(t, int32(2), rs.reviews.Load(), "one review per token")
	hits, _ := metricstest.Value(reg, "servercount_server_token_review_cache_hits_total")
	assert.Equal(t, 8.0, hits)

	clk.Step(11 * time.Second) // past DenialTTL, within CacheTTL
	require.NoError(t, a.AuthenticateToken(ctx, long))
	require.Error(t, a.AuthenticateToken(ctx, "bad"))
	assert.Equal(t, int32(3), rs.reviews.Load(), "a refusal is asked again after DenialTTL")

	clk.Step(time.Minute) // past CacheTTL
	require.NoError(t, a.AuthenticateToken(ctx, long))
	assert.Equal(t, int32(4), rs.reviews.Load(), "an acceptance is asked again after CacheTTL")

	// A token that expires before CacheTTL is trusted until it expires.
	require.NoError(t, a.AuthenticateToken(ctx, short))
	n := rs.reviews.Load()
	require.NoError(t, a.AuthenticateToken(ctx, short))
	assert.Equal(t, n, rs.reviews.Load())
	clk.Step(25 * time.Second)
	require.NoError(t, a.AuthenticateToken(ctx, short))
	assert.Equal(t, n+1, rs.reviews.Load(), "reviewed again once the token's exp has passed")

	accepted, _ := metricstest.Value(reg, "servercount_server_token_reviews_total", "result", "accepted")
	refused, _ := metricstest.Value(reg, "servercount_server_token_reviews_total", "result", "refused")
	assert.Equal(t, 4.0, accepted)
	assert.Equal(t, 2.0, refused)
}

func TestCacheCoalescesAndBoundsReviews(t *testing.T) {
	tokens := map[string]authenticationv1.TokenReviewStatus{}
	for i := range 4 {
		tokens[fmt.Sprint("agent-", i)] = authenticationv1.TokenReviewStatus{Authenticated: true, User: agentUser, Audiences: audience}
	}
	rs := newReviewServer(t, tokens)
	rs.gate = make(chan struct{})
	a, _, _ := newCached(t, rs, func(c *tokenreview.Config) { c.MaxInFlight = 2 })

	// 4 tokens, 25 agent streams each, at once.
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Go(func() { errs <- a.AuthenticateToken(t.Context(), fmt.Sprint("agent-", i%4)) })
	}
	require.Eventually(t, func() bool { return rs.inFlight.Load() == 2 }, 10*time.Second, time.Millisecond, "reviews up to the bound")
	close(rs.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int32(4), rs.reviews.Load(), "one review per token, not per stream")
	assert.Equal(t, int32(2), rs.maxFlight.Load(), "never more than MaxInFlight at once")
}

func TestCacheIsBoundedAndSkipsErrors(t *testing.T) {
	rs := newReviewServer(t, nil) // every token unknown: refused
	a, _, reg := newCached(t, rs, func(c *tokenreview.Config) { c.MaxEntries = 3 })
	for i := range 10 {
		require.Error(t, a.AuthenticateToken(t.Context(), fmt.Sprint("junk-", i)))
	}
	entries, _ := metricstest.Value(reg, "servercount_server_token_review_cache_entries")
	assert.Equal(t, 3.0, entries, "tokens from anyone cannot grow the cache past MaxEntries")

	rs.failing.Store(true)
	for range 2 {
		err := a.AuthenticateToken(t.Context(), "any")
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "refused")
	}
	assert.Equal(t, int32(12), rs.reviews.Load(), "an API server error is no verdict: not cached")
	errors, _ := metricstest.Value(reg, "servercount_server_token_reviews_total", "result", "error")
	assert.Equal(t, 2.0, errors)
}
