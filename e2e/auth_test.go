package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/e2e/harness"
)

// Scenario 9: proxy-servers check agents' service-account tokens with a
// TokenReview; a bad token, a token for another audience and a token of
// another service account are refused.
func TestAgentTokenReview(t *testing.T) {
	const audience = "system:konnectivity-server"
	e := newEnv(t, false)
	ctx := t.Context()
	for _, sa := range []string{"konnectivity-agent", "someone-else"} {
		_, err := the.cluster.Client.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	token := func(name, sa, aud string) string {
		tr, err := the.cluster.Client.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: new(int64(600))},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		f := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(f, []byte(tr.Status.Token), 0o600))
		return f
	}
	ip := e.ip(0)
	e.servers[ip] = e.fleet.StartServer(t, ip,
		"--agent-namespace="+e.ns, "--agent-service-account=konnectivity-agent",
		"--authentication-audience="+audience, "--kubeconfig="+the.cluster.Kubeconfig)
	e.setReady(ip)
	e.waitCount(e.svc.SRVName("agent"), 1)

	garbage := filepath.Join(t.TempDir(), "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte("not-a-token"), 0o600))
	start := func(name, tokenFile string) *harness.Agent {
		return e.fleet.StartAgent(t, harness.AgentConfig{
			Name: "agent-" + e.ns + "-" + name, DNSName: e.svc.SRVName("agent"), DNSServer: the.cluster.DNS.Addr,
			DialMode: "resolved", Extra: []string{"--service-account-token-path=" + tokenFile},
		})
	}
	good := start("good", token("good", "konnectivity-agent", audience))
	waitConnections(t, []*harness.Agent{good}, 1, 30*time.Second)
	e.requestThroughEach(ip)

	refused := []*harness.Agent{
		start("garbage", garbage),
		start("wrong-audience", token("wrong-audience", "konnectivity-agent", "someone-else")),
		start("wrong-account", token("wrong-account", "someone-else", audience)),
	}
	// Each refused agent keeps trying; wait until the server has refused
	// all three at least once, then check none got in.
	require.Eventually(t, func() bool {
		m, err := e.servers[ip].Metrics()
		return err == nil && m.Sum("servercount_server_agent_rejections_total") >= 3
	}, 30*time.Second, 100*time.Millisecond, "the server refuses the three agents")
	sample(t, refused, 2*time.Second, func(a *harness.Agent, conns int) {
		assert.Zero(t, conns, "%s got in", a.Name)
	})
	m, err := e.servers[ip].Metrics()
	require.NoError(t, err)
	assert.Equal(t, 1.0, m.Get("konnectivity_network_proxy_server_ready_backend_connections"), "only the good agent is connected")
	for k, v := range m {
		if strings.HasPrefix(k, "servercount_server_agent_rejections_total") {
			t.Logf("%s %v", k, v)
		}
	}
	assert.Equal(t, 1, good.Connections())
}
