package fleet

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/jwttest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/internal/proxytest"
	"github.com/servercount/servercount/internal/tokenreview"
)

// One host holds 1200 handshakes open with fresh bogus tokens, shaped as
// the agents' service-account tokens so that each needs a TokenReview,
// on 150 connections of 8 streams; each retries as soon as it is refused
// for its token, and a second after it is refused for a handshake bound.
// Meanwhile 100 real agents, each from an address of its own, connect: at
// least 95 are accepted at their first handshake and all of them in the
// end, and the API server never sees more reviews in a second than
// --token-review-qps and its burst allow. Before the bounds, 95 of 100
// were refused at once and the API server took about 2,000 reviews a
// second. The test counts refusals, not time: how long the 100 reviews
// take depends on the load of the machine, and is logged.
func TestRealAgentsGetInThroughAHandshakeFlood(t *testing.T) {
	const (
		floodConns = 150
		perConn    = 8
		realAgents = 100
	)
	reviews := startReviewEndpoint(t)
	reg := prometheus.NewRegistry()
	auth, err := tokenreview.New(tokenreview.Config{
		Client:    reviews.client(t, -1, 0), // no client-go limit: the authenticator's
		Namespace: reviewNamespace, ServiceAccount: reviewServiceAccount,
		Registerer: reg,
	})
	require.NoError(t, err)
	env := proxytest.NewEnv(t, "flood")
	srv := proxytest.StartServer(t, env, proxytest.ServerOptions{ID: "s1", Authenticator: auth, Registry: reg})
	clientTLS := env.ClientTLS(t, "agent")
	conn := func(ip string) *grpc.ClientConn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
		cc, err := grpc.NewClient(srv.AgentAddr(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	sub := jwttest.ServiceAccount(reviewNamespace, reviewServiceAccount)

	ctx, stop := context.WithCancel(t.Context())
	var flood sync.WaitGroup
	var attempts atomic.Int64
	for c := range floodConns {
		cc := conn("127.0.0.1")
		for w := range perConn {
			flood.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					attempts.Add(1)
					token := jwttest.Token(jwttest.Claims{Subject: sub}, fmt.Sprintf("bogus-%d-%d-%d", c, w, i))
					a, err := adversarytest.DialDeafAgent(ctx, adversarytest.AgentConfig{Conn: cc, ID: fmt.Sprintf("flood-%d-%d", c, w), Token: token})
					if err == nil {
						a.Close()
						t.Error("a bogus token was accepted")
						return
					}
					if status.Code(err) == codes.ResourceExhausted {
						select {
						case <-ctx.Done():
						case <-time.After(time.Second):
						}
					}
				}
			})
		}
	}
	defer func() { stop(); flood.Wait() }()
	// The flood is on once the server refuses its host without a check.
	require.Eventually(t, func() bool {
		v, _ := metricstest.Value(reg, "servercount_server_agent_rejections_total", "reason", "too_many_refused_tokens")
		return v > 0
	}, 30*time.Second, time.Millisecond)

	// The real agents' connections are made first: 100 TLS handshakes at
	// once take this process's two cores most of a second under the race
	// detector, where each agent has a node's CPU of its own. What is
	// timed is their handshakes' admission.
	ccs := make([]*grpc.ClientConn, realAgents)
	for i := range ccs {
		ccs[i] = conn(fmt.Sprintf("127.0.1.%d", i+1))
		ccs[i].Connect()
	}
	for _, cc := range ccs {
		waitReady(t, cc)
	}
	start := time.Now()
	type admission struct {
		took    time.Duration
		refused int // handshakes refused before the one admitted
	}
	admitted := make(chan admission, realAgents)
	var real sync.WaitGroup
	for i, cc := range ccs {
		real.Go(func() {
			token := agentToken(fmt.Sprint("real-", i))
			for refused := 0; ctx.Err() == nil; refused++ {
				a, err := adversarytest.DialDeafAgent(ctx, adversarytest.AgentConfig{Conn: cc, ID: fmt.Sprint("real-", i), Token: token})
				if err == nil {
					admitted <- admission{time.Since(start), refused}
					t.Cleanup(a.Close)
					return
				}
				t.Logf("real agent %d refused: %v", i, err)
				select { // an agent's retry, much shortened
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	// Every real agent gets in, however slow the machine; the deadline
	// only ends a test that has failed.
	allIn := make(chan struct{})
	go func() { real.Wait(); close(allIn) }()
	select {
	case <-allIn:
	case <-time.After(2 * time.Minute):
	}
	stop()
	<-allIn
	flood.Wait()
	close(admitted)

	var took []time.Duration
	first := 0
	for a := range admitted {
		took = append(took, a.took)
		if a.refused == 0 {
			first++
		}
	}
	slices.Sort(took)
	t.Logf("flood: %d handshakes; real agents accepted: %d of %d, %d at their first handshake (median %v, last %v)",
		attempts.Load(), len(took), realAgents, first, at(took, len(took)/2), at(took, len(took)-1))
	assert.Len(t, took, realAgents, "real agents accepted")
	assert.GreaterOrEqual(t, first, 95, "real agents accepted at their first handshake")

	// The API server's view: no second saw more than the bound, a token
	// bucket of DefaultBurst filled at DefaultQPS.
	times := reviews.arrivals()
	busiest := 0
	for i := range times {
		j := i
		for j < len(times) && times[j].Sub(times[i]) < time.Second {
			j++
		}
		busiest = max(busiest, j-i)
	}
	t.Logf("the API server got %d reviews, at most %d in one second", len(times), busiest)
	assert.LessOrEqual(t, busiest, tokenreview.DefaultQPS+tokenreview.DefaultBurst, "reviews in the busiest second")
}

// waitReady waits until cc is connected.
func waitReady(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		require.True(t, cc.WaitForStateChange(ctx, s), "connection not ready: %v", s)
	}
}

// at is d[i], or 0 when there is none.
func at(d []time.Duration, i int) time.Duration {
	if i < 0 || i >= len(d) {
		return 0
	}
	return d[i]
}
