package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/e2e/harness"
	"github.com/servercount/servercount/internal/tokenreview"
)

// The audience and service account a proxy-server wants in agents'
// tokens, as the manifests configure them.
const (
	tokenAudience       = "system:konnectivity-server"
	agentServiceAccount = "konnectivity-agent"
)

// createServiceAccounts creates the service accounts names in the test's
// namespace; there is no controller-manager to create even "default".
func (e *env) createServiceAccounts(names ...string) {
	e.t.Helper()
	for _, sa := range names {
		_, err := the.cluster.Client.CoreV1().ServiceAccounts(e.ns).Create(e.t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(e.t, err)
	}
}

// tokenFile asks the API server for a token of service account sa for
// audience aud, valid 10 minutes, writes it to a file called name and
// returns the file's path.
func (e *env) tokenFile(name, sa, aud string) string {
	e.t.Helper()
	tr, err := the.cluster.Client.CoreV1().ServiceAccounts(e.ns).CreateToken(e.t.Context(), sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: new(int64(600))},
	}, metav1.CreateOptions{})
	require.NoError(e.t, err)
	f := filepath.Join(e.t.TempDir(), name)
	require.NoError(e.t, os.WriteFile(f, []byte(tr.Status.Token), 0o600))
	return f
}

// startReviewingServer starts one server that checks agents' tokens with
// TokenReviews, publishes it ready and returns it.
func (e *env) startReviewingServer() *harness.Server {
	e.t.Helper()
	ip := e.startServers(0, 1,
		"--agent-namespace="+e.ns, "--agent-service-account="+agentServiceAccount,
		"--authentication-audience="+tokenAudience, "--kubeconfig="+the.cluster.Kubeconfig)[0]
	e.publishReady(ip)
	return e.servers[ip]
}

// tokenAgent is the configuration of an agent named name that counts the
// servers through DNS, dials each, and shows the token in tokenFile.
func (e *env) tokenAgent(name, tokenFile string) harness.AgentConfig {
	return harness.AgentConfig{
		Name: "agent-" + e.ns + "-" + name, DNSName: e.svc.SRVName("agent"), DNSServer: the.cluster.DNS.Addr,
		DialMode: "resolved", Extra: []string{"--service-account-token-path=" + tokenFile},
	}
}

// Scenario 9: proxy-servers check agents' service-account tokens with a
// TokenReview; a bad token, a token for another audience and a token of
// another service account are refused.
func TestAgentTokenReview(t *testing.T) {
	e := newEnv(t, false)
	e.createServiceAccounts(agentServiceAccount, "someone-else")
	srv := e.startReviewingServer()

	garbage := filepath.Join(t.TempDir(), "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte("not-a-token"), 0o600))
	start := func(name, tokenFile string) *harness.Agent {
		return e.fleet.StartAgent(t, e.tokenAgent(name, tokenFile))
	}
	good := start("good", e.tokenFile("good", agentServiceAccount, tokenAudience))
	waitConnections(t, []*harness.Agent{good}, 1, 30*time.Second)
	e.requestThroughEach(srv.IP)

	refused := []*harness.Agent{
		start("garbage", garbage),
		start("wrong-audience", e.tokenFile("wrong-audience", agentServiceAccount, "someone-else")),
		start("wrong-account", e.tokenFile("wrong-account", "someone-else", tokenAudience)),
	}
	// Each refused agent keeps trying; wait until the server has refused
	// all three at least once, then check none got in.
	require.Eventually(t, func() bool {
		m, err := srv.Metrics()
		return err == nil && m.Sum("servercount_server_agent_rejections_total") >= 3
	}, 30*time.Second, 100*time.Millisecond, "the server refuses the three agents")
	sample(t, refused, 2*time.Second, func(a *harness.Agent, conns int) {
		assert.Zero(t, conns, "%s got in", a.Name)
	})
	m, err := srv.Metrics()
	require.NoError(t, err)
	assert.Equal(t, 1.0, m.Sum("konnectivity_network_proxy_server_ready_backend_connections"), "only the good agent is connected")
	// Not a JWT, another audience, another account: each is refused from
	// its claims, without a TokenReview.
	assert.GreaterOrEqual(t, m.Sum("servercount_server_token_prechecks_refused_total"), 3.0, "refusals without a review")
	assert.Zero(t, m.Sum("servercount_server_token_reviews_total", "result", "refused"), "reviews that refused a token")
	// Not a JWT, another audience, another account: each is refused from
	// its claims, without a TokenReview.
	assert.GreaterOrEqual(t, m.Sum("servercount_server_token_prechecks_refused_total"), 3.0, "refusals without a review")
	assert.Zero(t, m.Sum("servercount_server_token_reviews_total", "result", "refused"), "reviews that refused a token")
	for k, v := range m {
		if strings.HasPrefix(k, "servercount_server_agent_rejections_total") {
			t.Logf("%s %v", k, v)
		}
	}
	assert.Equal(t, 1, good.Connections())
}

// Scenario 10: a proxy-server caches its TokenReviews, so K
// agents that each reconnect R times cost the real kube-apiserver about K
// reviews, not K x (R+1). The count comes from the API server's own
// apiserver_request_total, not from our metrics, and our metrics must
// agree with it.
//
// Without the cache every connection would be reviewed: K x (R+1) = 24
// reviews here, above both the ceiling of about K and K x R, and the
// server would report no cache hits; so each of those three checks
// fails.
func TestTokenReviewsAreCached(t *testing.T) {
	const (
		agents     = 4 // K
		reconnects = 5 // R, after the first connection
		// cacheTTL is how long the server trusts an accepted token
		// (the tokens live 10 minutes, longer than this).
		cacheTTL = tokenreview.DefaultCacheTTL
	)
	e := newEnv(t, false)
	e.createServiceAccounts(agentServiceAccount)

	// Each agent has a token of its own, so each costs one review:
	// singleflight cannot merge two agents' reviews.
	var cfgs []harness.AgentConfig
	for i := range agents {
		token := e.tokenFile(fmt.Sprintf("token-%d", i), agentServiceAccount, tokenAudience)
		cfgs = append(cfgs, e.tokenAgent(strconv.Itoa(i), token))
	}

	// The API server's count before this test's server exists. The
	// suite's tests run one at a time (an earlier test's proxy-server
	// has stopped by now) and nothing else sends TokenReviews, so the
	// delta is this server's reviews alone.
	before := apiServerTokenReviews(t)

	srv := e.startReviewingServer()

	// authenticated is how many agent streams the server has judged:
	// each is either a cache hit or a review.
	authenticated := func(m harness.Metrics) int {
		return int(m.Sum("servercount_server_token_review_cache_hits_total") + m.Sum("servercount_server_token_reviews_total"))
	}
	// waitServer waits until the server holds want agent streams and, if
	// minAuth > 0, has authenticated at least minAuth of them in all.
	waitServer := func(want, minAuth int, what string) {
		t.Helper()
		var conns, auth int
		require.Eventually(t, func() bool {
			m, err := srv.Metrics()
			if err != nil {
				return false
			}
			conns = int(m.Sum("konnectivity_network_proxy_server_ready_backend_connections"))
			auth = authenticated(m)
			return conns == want && auth >= minAuth
		}, 30*time.Second, 50*time.Millisecond, "%s: want %d agent streams and at least %d authenticated; server has %d streams, %d authenticated", what, want, minAuth, conns, auth)
	}

	start := time.Now() // before the first review
	var running []*harness.Agent
	for _, cfg := range cfgs {
		running = append(running, e.fleet.StartAgent(t, cfg))
	}
	waitConnections(t, running, 1, 30*time.Second)
	waitServer(agents, agents, "first connections")

	// Each round breaks every agent's stream for real (the process
	// exits, its TCP connection closes) and waits until the server has
	// dropped them all, then starts the agents again with the same
	// tokens against the same server process, whose cache is in memory.
	for round := 1; round <= reconnects; round++ {
		var wg sync.WaitGroup
		for _, a := range running {
			wg.Go(a.Proc.Stop)
		}
		wg.Wait()
		waitServer(0, 0, fmt.Sprintf("round %d: agents stopped", round))
		running = running[:0]
		for _, cfg := range cfgs {
			running = append(running, e.fleet.StartAgent(t, cfg))
		}
		waitConnections(t, running, 1, 30*time.Second)
		waitServer(agents, agents*(round+1), fmt.Sprintf("round %d: agents back", round))
	}
	elapsed := time.Since(start)

	m, err := srv.Metrics()
	require.NoError(t, err)
	accepted := int(m.Sum("servercount_server_token_reviews_total", "result", "accepted"))
	refused := int(m.Sum("servercount_server_token_reviews_total", "result", "refused"))
	failed := int(m.Sum("servercount_server_token_reviews_total", "result", "error"))
	reviews := accepted + refused + failed
	hits := int(m.Sum("servercount_server_token_review_cache_hits_total"))

	// kube-apiserver counts a request once it has answered it, which
	// can be just after the server read the answer: wait until its
	// count has caught up with what the server sent (it can be lower by
	// failed reviews that never reached it, never higher).
	var after harness.Metrics
	var delta int
	require.Eventually(t, func() bool {
		after = apiServerTokenReviews(t)
		delta = int(tokenReviews(after) - tokenReviews(before))
		return delta >= accepted+refused
	}, 10*time.Second, 100*time.Millisecond, "kube-apiserver counts the %d TokenReviews the server says it got answers to; it counts %d", accepted+refused, delta)

	// The slack above K: a review that got no answer (result "error")
	// is no verdict and is not cached, and the agent's retry is
	// reviewed again; and an accepted verdict expires after cacheTTL,
	// so a run longer than that may review each token once more per
	// cacheTTL. Both are 0 in a normal run, and neither is what a
	// missing cache would add.
	expiries := int(elapsed / cacheTTL)
	slack := failed + agents*expiries
	t.Logf("K=%d agents, R=%d reconnects each, %d connections in %s", agents, reconnects, agents*(reconnects+1), elapsed.Round(time.Millisecond))
	t.Logf("kube-apiserver: %d TokenReviews (apiserver_request_total of tokenreviews: %v before, %v after)", delta, tokenReviews(before), tokenReviews(after))
	for _, s := range tokenReviewSeries(after) {
		t.Logf("  %s", s)
	}
	t.Logf("proxy-server: %d reviews (%d accepted, %d refused, %d error), %d cache hits, %d authentications", reviews, accepted, refused, failed, hits, hits+reviews)
	t.Logf("bounds: K=%d <= %d <= K+slack=%d (slack: %d failed reviews, %d cache expiries), and < K*R=%d", agents, delta, agents+slack, failed, expiries, agents*reconnects)

	assert.GreaterOrEqual(t, delta, agents, "kube-apiserver reviewed each of the %d tokens at least once", agents)
	assert.LessOrEqual(t, delta, agents+slack, "kube-apiserver reviews: about one per agent, not one per connection")
	assert.Less(t, delta, agents*reconnects, "kube-apiserver reviews: fewer than K x R")
	// The server's metrics agree with the API server's.
	assert.Equal(t, 0, refused, "no valid token is refused")
	assert.LessOrEqual(t, accepted, delta, "each accepted review reached kube-apiserver")
	assert.LessOrEqual(t, delta, reviews, "kube-apiserver counts no review the server did not send")
	assert.GreaterOrEqual(t, hits, agents*reconnects, "every reconnection is judged from the cache")
}

// apiServerTokenReviews reads kube-apiserver's metrics.
func apiServerTokenReviews(t *testing.T) harness.Metrics {
	t.Helper()
	m, err := the.cluster.APIServerMetrics(t.Context())
	require.NoError(t, err)
	return m
}

// tokenReviews is how many TokenReviews kube-apiserver has served, over
// every response code (create is the resource's only verb).
func tokenReviews(m harness.Metrics) float64 {
	return m.Sum("apiserver_request_total", "group", "authentication.k8s.io", "resource", "tokenreviews")
}

// tokenReviewSeries are the apiserver_request_total series of
// tokenreviews, with their values, for the log.
func tokenReviewSeries(m harness.Metrics) []string {
	var out []string
	for k, v := range m {
		if strings.HasPrefix(k, "apiserver_request_total{") && strings.Contains(k, `resource="tokenreviews"`) {
			out = append(out, fmt.Sprintf("%s %v", k, v))
		}
	}
	sort.Strings(out)
	return out
}

// Scenario 9b: with --bind-agent-identifiers, an agent whose
// token is bound to a pod on node X may claim X's name and address, and
// gets X's traffic; claiming node Y's as well gets it none of Y's, and the
// dropped claims are counted. The API server's TokenReview names the node
// (authentication.kubernetes.io/node-name); the server reads the Node's
// addresses from a watch.
func TestBoundIdentifiersFromPodTokens(t *testing.T) {
	e := newEnv(t, false)
	e.createServiceAccounts(agentServiceAccount)
	ctx := t.Context()
	nodes := the.cluster.Client.CoreV1().Nodes()
	// Each node's address is on the namespace's loopback, with a target
	// of its own behind it.
	node := func(name, ip string) string {
		name += "-" + e.ns
		n, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
		return name
	}
	target := func(ip, says string) string {
		lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		require.NoError(t, err)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, says) }))
		srv.Listener = lis
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	xIP, yIP := e.ip(60), e.ip(61)
	x, y := node("node-x", xIP), node("node-y", yIP)
	xURL, yURL := target(xIP, "hello from x"), target(yIP, "hello from y")

	// A pod scheduled on node X, and a token bound to it.
	pod, err := the.cluster.Client.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-on-x"},
		Spec: corev1.PodSpec{ServiceAccountName: agentServiceAccount, NodeName: x,
			Containers: []corev1.Container{{Name: "agent", Image: "konnectivity-agent"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := the.cluster.Client.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, agentServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tokenAudience}, ExpirationSeconds: new(int64(600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600))

	ip := e.startServers(0, 1,
		"--agent-namespace="+e.ns, "--agent-service-account="+agentServiceAccount,
		"--authentication-audience="+tokenAudience, "--kubeconfig="+the.cluster.Kubeconfig,
		"--bind-agent-identifiers", "--proxy-strategies=destHost")[0]
	e.publishReady(ip)
	srv := e.servers[ip]
	cfg := e.tokenAgent("x", tokenFile)
	cfg.Extra = append(cfg.Extra, "--agent-identifiers=host="+x+"&ipv4="+xIP+"&host="+y+"&ipv4="+yIP)
	a := e.fleet.StartAgent(t, cfg)
	waitConnections(t, []*harness.Agent{a}, 1, 30*time.Second)

	// X's traffic reaches the agent.
	var body string
	require.Eventually(t, func() bool {
		body, err = srv.Get(xURL + "/")
		return err == nil
	}, 10*time.Second, 100*time.Millisecond, "request to node X: %v", err)
	assert.Equal(t, "hello from x", body)
	// Y's, by address and by name, does not: no agent may take it.
	for _, u := range []string{yURL, strings.Replace(yURL, yIP, y, 1)} {
		_, err := srv.Get(u + "/")
		assert.ErrorContains(t, err, "CONNECT", "request to %s", u)
	}
	m, err := srv.Metrics()
	require.NoError(t, err)
	assert.Equal(t, 2.0, m.Sum("konnectivity_network_proxy_server_dial_failure_count", "reason", "no_agent"), "node Y's dials found no agent")
	assert.GreaterOrEqual(t, m.Sum("servercount_server_unbound_identifier_claims_total"), 2.0, "node Y's name and address, dropped")
	assert.Zero(t, m.Sum("servercount_server_agent_rejections_total"), "the agent itself is accepted")
}
