package tokenreview_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes/scheme"

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
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
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
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: proxy-server}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL)), 0o600))
	return kubeconfig
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
