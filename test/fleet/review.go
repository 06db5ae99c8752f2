package fleet

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/rest"

	"github.com/servercount/servercount/internal/jwttest"
	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/tokenreview"
)

// The service account whose tokens the fleet's servers accept.
const (
	reviewNamespace      = "kube-system"
	reviewServiceAccount = "konnectivity-agent"
)

// tokenPrefix starts the name of every token the review endpoint accepts.
const tokenPrefix = "token-of-"

// agentToken returns the token of the agent called name, shaped as the
// agents' service-account token (see jwttest): the endpoint accepts it.
func agentToken(name string) string {
	return jwttest.Token(jwttest.Claims{Subject: jwttest.ServiceAccount(reviewNamespace, reviewServiceAccount)}, tokenPrefix+name)
}

// reviewPath is where kube-apiserver takes TokenReviews.
const reviewPath = "/apis/authentication.k8s.io/v1/tokenreviews"

// reviewEndpoint stands in for kube-apiserver's TokenReview API over
// HTTPS: it accepts every token whose name starts with tokenPrefix as the
// agents' service account's, and counts the reviews. The real API server
// is the e2e suite's job; here only the number of reviews matters.
type reviewEndpoint struct {
	srv   *httptest.Server
	count atomic.Int64
	// delay is how long each review takes, whether or not its client is
	// still there, as an API server slow to answer; set before the first
	// review. inFlight counts the reviews being answered, and mostInFlight
	// the most at once.
	delay                  time.Duration
	inFlight, mostInFlight atomic.Int64

	mu    sync.Mutex
	times []time.Time // when each review came; guarded by mu
}

// arrivals returns when each review came, in order.
func (e *reviewEndpoint) arrivals() []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.times)
}

func startReviewEndpoint(tb testing.TB) *reviewEndpoint {
	e := &reviewEndpoint{}
	e.srv = httptest.NewTLSServer(http.HandlerFunc(e.serve))
	tb.Cleanup(e.srv.Close)
	return e
}

func (e *reviewEndpoint) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != reviewPath {
		http.NotFound(w, r)
		return
	}
	var tr authenticationv1.TokenReview
	if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.count.Add(1)
	e.mu.Lock()
	e.times = append(e.times, time.Now())
	e.mu.Unlock()
	n := e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	for m := e.mostInFlight.Load(); n > m && !e.mostInFlight.CompareAndSwap(m, n); m = e.mostInFlight.Load() {
	}
	if e.delay > 0 {
		time.Sleep(e.delay) // the API server's work, which a client that leaves does not stop
	}
	tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
	tr.Status = authenticationv1.TokenReviewStatus{
		Authenticated: strings.HasPrefix(jwttest.Name(tr.Spec.Token), tokenPrefix),
		User:          authenticationv1.UserInfo{Username: "system:serviceaccount:" + reviewNamespace + ":" + reviewServiceAccount},
		Audiences:     tr.Spec.Audiences,
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(&tr) // the client has gone: nothing to do
}

// kubeconfig writes a kubeconfig for the endpoint into dir, for a
// proxy-server process (with --kube-api-content-type=application/json:
// the endpoint decodes JSON only), and returns its path.
func (e *reviewEndpoint) kubeconfig(tb testing.TB, dir string) string {
	tb.Helper()
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.srv.Certificate().Raw}))
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: review
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: proxy-server
  user: {token: proxy-server}
contexts:
- name: review
  context: {cluster: review, user: proxy-server}
current-context: review
`, e.srv.URL, ca)
	path := filepath.Join(dir, "kubeconfig")
	require.NoError(tb, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

// client returns an API client for the endpoint, limited to qps and
// burst as --kubeconfig-qps and --kubeconfig-burst limit the server's.
// It speaks JSON: the endpoint does not decode protobuf.
func (e *reviewEndpoint) client(tb testing.TB, qps float32, burst int) tokenreview.Client {
	tb.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.srv.Certificate().Raw})
	c, err := kubeclient.NewTokenReviews(&rest.Config{
		Host:            e.srv.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		ContentConfig:   rest.ContentConfig{ContentType: "application/json"},
		QPS:             qps,
		Burst:           burst,
	})
	require.NoError(tb, err, "build TokenReview client")
	return c
}
