// Package tokenreview authenticates proxy-agents the Kubernetes way: an
// agent presents a service-account token, and the proxy-server asks the
// API server whether it is valid, for the expected audience and service
// account (a TokenReview). It implements server.TokenAuthenticator.
//
// Reviews are cached, as kube-apiserver caches its webhook token reviews:
// an agent reconnects with the same token, and a fleet of agents that
// reconnect together after a server rollout must not cost one review per
// stream. An accepted token is trusted for CacheTTL or until its own
// expiry, whichever is first; a refused one is refused again for
// DenialTTL without asking; concurrent reviews of one token are one
// request; and at most MaxInFlight reviews run at once.
//
// Tokens come from peers that have proven nothing yet, so a flood of
// distinct bogus tokens must cost little and end with its callers. A token
// that cannot be a service-account token of the agents' account for the
// audience (not a JWT, expired, of another subject, without the audience)
// is refused without a review. A review waits for its slot, and runs,
// only while some caller still waits for it; at most MaxQueued reviews
// wait for a slot, and a token beyond them is refused at once
// (ErrOverloaded), and its agent tries again, as agents do; and at most
// QPS reviews a second reach the API server.
package tokenreview

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/server"
)

// Config says which tokens are accepted.
type Config struct {
	// Kubeconfig is the file to reach the API server with; empty means the
	// in-cluster configuration.
	Kubeconfig string
	// Audience, when set, must be among the token's audiences
	// (--authentication-audience).
	Audience string
	// Namespace and ServiceAccount name the only service account whose
	// tokens are accepted (--agent-namespace, --agent-service-account).
	Namespace, ServiceAccount string
	// Client sends the reviews; nil means one built from Kubeconfig.
	Client Client

	// CacheTTL bounds how long an accepted token is trusted without a new
	// review; default DefaultCacheTTL.
	CacheTTL time.Duration
	// DenialTTL is how long a refused token is refused without a new
	// review; default DefaultDenialTTL.
	DenialTTL time.Duration
	// MaxEntries bounds the cache, which tokens from anyone can fill;
	// default DefaultMaxEntries.
	MaxEntries int
	// MaxInFlight bounds the reviews sent at once; default
	// DefaultMaxInFlight.
	MaxInFlight int
	// ReviewTimeout bounds one review, from its start to the API
	// server's answer; default DefaultReviewTimeout.
	ReviewTimeout time.Duration
	// MaxQueued bounds the reviews waiting for one of the MaxInFlight
	// slots; a token that would be one more is refused at once. Default
	// DefaultMaxQueued.
	MaxQueued int
	// QPS and Burst bound the reviews sent a second, in a token bucket
	// of Burst (--token-review-qps, --token-review-burst); defaults
	// DefaultQPS and DefaultBurst. Client should have no rate limit of
	// its own (client-go's rest.Config.QPS below zero).
	QPS   float64
	Burst int
	// Registerer receives the review metrics; nil registers none.
	Registerer prometheus.Registerer
	// Nodes knows the names and addresses of nodes, for IdentifyToken;
	// nil means a token proves its node's name alone.
	Nodes Nodes
	// Clock tells when cached verdicts expire; nil means the real clock.
	Clock clock.Clock
}

// Nodes says what names and addresses a node has.
type Nodes interface {
	// Node returns the host names and addresses of the node called name;
	// ok is false when the node is not known.
	Node(name string) (hosts []string, addrs []netip.Addr, ok bool)
}

// Client creates TokenReviews. client-go's
// clientset.AuthenticationV1().TokenReviews() is one, and so is
// kubeclient.TokenReviews.
type Client interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// Cache defaults: kube-apiserver's webhook token cache keeps successes 2
// minutes and failures 10 seconds.
const (
	DefaultCacheTTL    = 2 * time.Minute
	DefaultDenialTTL   = 10 * time.Second
	DefaultMaxEntries  = 10000
	DefaultMaxInFlight = 32
	// DefaultReviewTimeout bounds a review as a handshake is: an agent
	// waits no longer.
	DefaultReviewTimeout = 10 * time.Second
	// DefaultMaxQueued lets a fleet's reconnecting agents queue (a queue
	// of 1024 behind 32 slots is about 0.6 s at 20 ms a review) while a
	// flood of bogus tokens is refused beyond it.
	DefaultMaxQueued = 1024
	// DefaultQPS and DefaultBurst let a fleet of 5,000 agents back in
	// within a minute of a server's restart, with an empty cache, at a
	// small cost to the API server (a review is a signature check and a
	// lookup in its caches). client-go's default, which bounded reviews
	// before, is 5 a second.
	DefaultQPS   = 100
	DefaultBurst = 100
	// clockSkew is how far the API server's clock may be from ours when
	// the precheck reads exp and nbf: it refuses only what the API server
	// surely would.
	clockSkew = time.Minute
)

// ErrOverloaded is returned for a token that found MaxQueued reviews
// waiting already: the agent should try again.
var ErrOverloaded = errors.New("too many agent tokens waiting for review: try again")

// An Authenticator says whose a token is, for Config.BindIdentifiers.
var _ server.TokenIdentifier = (*Authenticator)(nil)

// Authenticator checks agent tokens with TokenReviews. It is safe for
// concurrent use.
type Authenticator struct {
	client   Client
	audience string
	username string
	cfg      Config
	metrics  *metrics

	inFlight chan struct{} // a token per review sent
	limiter  *rate.Limiter // reviews a second

	mu    sync.Mutex // guards cache, reviews and pending
	cache map[[sha256.Size]byte]verdict
	// reviews are the reviews not yet decided, by token hash: a second
	// caller of the same token waits for the same review.
	reviews map[[sha256.Size]byte]*review
	// pending counts the reviews started and not yet over, in flight or
	// waiting for a slot; bounded by MaxInFlight + MaxQueued.
	pending int
}

// review is one TokenReview that callers wait for.
type review struct {
	done chan struct{} // closed once node and err are set
	node string        // the node the token is bound to, "" for none
	err  error
	// cancelWait ends the review's wait for the rate limit and a slot,
	// not the request once sent, and cancel the whole review.
	cancelWait, cancel context.CancelFunc
	// waiters counts the callers waiting for it; the last to leave
	// cancels its wait, unless sent is set: it has its slot and is
	// asking. Both guarded by Authenticator.mu.
	waiters int
	sent    bool
}

// verdict is a cached review: err is nil for an accepted token, which
// is bound to node ("" for none).
type verdict struct {
	node  string
	err   error
	until time.Time
}

// New returns an Authenticator for cfg.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Namespace == "" || cfg.ServiceAccount == "" {
		return nil, errors.New("token review needs the agents' service account: set --agent-namespace and --agent-service-account")
	}
	client := cfg.Client
	if client == nil {
		rc, err := kubeclient.Config(kubeclient.Options{Kubeconfig: cfg.Kubeconfig})
		if err != nil {
			return nil, err
		}
		if client, err = kubeclient.NewTokenReviews(rc); err != nil {
			return nil, err
		}
	}
	setDefault(&cfg.CacheTTL, DefaultCacheTTL)
	setDefault(&cfg.DenialTTL, DefaultDenialTTL)
	setDefault(&cfg.MaxEntries, DefaultMaxEntries)
	setDefault(&cfg.MaxInFlight, DefaultMaxInFlight)
	setDefault(&cfg.MaxQueued, DefaultMaxQueued)
	setDefault(&cfg.ReviewTimeout, DefaultReviewTimeout)
	setDefault(&cfg.QPS, DefaultQPS)
	setDefault(&cfg.Burst, DefaultBurst)
	cfg.Clock = clock.Or(cfg.Clock)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Authenticator{
		client:   client,
		audience: cfg.Audience,
		username: "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
		cfg:      cfg,
		metrics:  m,
		inFlight: make(chan struct{}, cfg.MaxInFlight),
		limiter:  rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst),
		cache:    map[[sha256.Size]byte]verdict{},
		reviews:  map[[sha256.Size]byte]*review{},
	}, nil
}

func setDefault[T time.Duration | int | float64](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

// AuthenticateToken accepts token if the API server says, or said
// recently, that it is valid, for the audience, and of the agents' service
// account.
func (a *Authenticator) AuthenticateToken(ctx context.Context, token string) error {
	_, err := a.verdict(ctx, token)
	return err
}

// IdentifyToken authenticates token as AuthenticateToken does and returns
// the node its holder runs on: the node the token is bound to (the
// TokenReview's authentication.kubernetes.io/node-name, which the API
// server gives for a token bound to a pod scheduled on a node, or to the
// node), with that node's names and addresses when Config.Nodes knows
// them. A token bound to no node proves nothing: the zero Identity.
func (a *Authenticator) IdentifyToken(ctx context.Context, token string) (server.Identity, error) {
	node, err := a.verdict(ctx, token)
	if err != nil || node == "" {
		return server.Identity{}, err
	}
	id := server.Identity{Hosts: []string{node}}
	if a.cfg.Nodes != nil {
		if hosts, addrs, ok := a.cfg.Nodes.Node(node); ok {
			id.Hosts = append(id.Hosts, hosts...)
			id.Addrs = addrs
		}
	}
	return id, nil
}

// verdict returns the node of token, "" for none, if the API server says,
// or said recently, that it is valid; else why not.
func (a *Authenticator) verdict(ctx context.Context, token string) (string, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := a.cached(key); ok {
		a.metrics.hits.Inc()
		return v.node, v.err
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("review agent token: %w", err)
	}
	if err := a.precheck(token); err != nil {
		a.metrics.prechecked.Inc()
		return "", err
	}
	r, err := a.join(key, token)
	if err != nil {
		return "", err
	}
	select {
	case <-r.done:
		return r.node, r.err
	case <-ctx.Done():
		a.leave(key, r)
		return "", fmt.Errorf("review agent token: %w", ctx.Err())
	}
}

// join returns the review of key that is under way, or starts one, and
// counts the caller as waiting for it. Callers that share a review do not
// share a context: the review runs on its own, bounded by ReviewTimeout.
// It waits for the rate limit and a slot for as long as any of them
// waits; once sent, it runs to the answer, and holds its slot until then,
// whoever still waits: the API server goes on with a request whose
// client hung up, so a slot freed at once would let more than
// MaxInFlight run there at once. Its verdict is cached for a caller who
// comes back.
func (a *Authenticator) join(key [sha256.Size]byte, token string) (*review, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.reviews[key]
	if r == nil {
		if a.pending >= a.cfg.MaxInFlight+a.cfg.MaxQueued {
			a.metrics.overloaded.Inc()
			return nil, ErrOverloaded
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ReviewTimeout)
		waitCtx, cancelWait := context.WithCancel(ctx)
		r = &review{done: make(chan struct{}), cancelWait: cancelWait, cancel: cancel}
		a.reviews[key] = r
		a.pending++
		a.metrics.pending.Set(float64(a.pending))
		go a.run(waitCtx, ctx, key, token, r)
	}
	r.waiters++
	return r, nil
}

// leave counts a caller that stopped waiting for r. The last one ends its
// wait for the rate limit and a slot; a review already sent goes on, and
// a caller who comes back joins it.
func (a *Authenticator) leave(key [sha256.Size]byte, r *review) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.waiters--; r.waiters == 0 && !r.sent {
		r.cancelWait()
		if a.reviews[key] == r {
			delete(a.reviews, key) // a new caller starts afresh
		}
	}
}

// run carries out review r of token, waiting for the rate limit and a
// slot under waitCtx and asking under ctx, and remembers its verdict.
func (a *Authenticator) run(waitCtx, ctx context.Context, key [sha256.Size]byte, token string, r *review) {
	r.node, r.err = a.review(waitCtx, ctx, token, r)
	if ctx.Err() == nil || r.err == nil {
		a.remember(key, token, r.node, r.err)
	}
	r.cancel()
	a.mu.Lock()
	if a.reviews[key] == r {
		delete(a.reviews, key)
	}
	a.pending--
	a.metrics.pending.Set(float64(a.pending))
	a.mu.Unlock()
	close(r.done)
}

// cached returns the cached verdict on key, if one is still valid.
func (a *Authenticator) cached(key [sha256.Size]byte) (verdict, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.cache[key]
	if ok && !a.cfg.Clock.Now().Before(v.until) {
		delete(a.cache, key)
		a.metrics.entries.Set(float64(len(a.cache)))
		return verdict{}, false
	}
	return v, ok
}

// remember caches the verdict err on token: an acceptance until CacheTTL
// or the token's expiry, a refusal for DenialTTL. An API server error is
// not a verdict and is not cached.
func (a *Authenticator) remember(key [sha256.Size]byte, token, node string, err error) {
	now := a.cfg.Clock.Now()
	var until time.Time
	switch {
	case err == nil:
		until = now.Add(a.cfg.CacheTTL)
		if exp, ok := expiry(token); ok && exp.Before(until) {
			until = exp
		}
	case errors.Is(err, errDenied):
		until = now.Add(a.cfg.DenialTTL)
	default:
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= a.cfg.MaxEntries {
		for k, v := range a.cache {
			if !now.Before(v.until) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= a.cfg.MaxEntries {
			return // full of live verdicts: review again rather than grow
		}
	}
	a.cache[key] = verdict{node: node, err: err, until: until}
	a.metrics.entries.Set(float64(len(a.cache)))
}

// review asks the API server about token for r, at most MaxInFlight at
// once and QPS a second, and returns the node it is bound to. It waits
// for both under waitCtx, and asks under ctx.
func (a *Authenticator) review(waitCtx, ctx context.Context, token string, r *review) (string, error) {
	a.metrics.throttled.Inc()
	err := a.limiter.Wait(waitCtx)
	a.metrics.throttled.Dec()
	if err != nil {
		return "", fmt.Errorf("wait to review agent token (at most %v a second): %w", a.cfg.QPS, err)
	}
	select {
	case a.inFlight <- struct{}{}:
	case <-waitCtx.Done():
		return "", fmt.Errorf("wait to review agent token: %w", waitCtx.Err())
	}
	defer func() { <-a.inFlight }()
	a.mu.Lock()
	err = waitCtx.Err()
	r.sent = err == nil
	a.mu.Unlock()
	if err != nil {
		// The slot and the end came together: select chose the slot.
		return "", fmt.Errorf("wait to review agent token: %w", err)
	}
	a.metrics.inFlight.Inc()
	defer a.metrics.inFlight.Dec()
	start := time.Now()
	node, err := a.ask(ctx, token)
	a.metrics.latency.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		a.metrics.reviews.WithLabelValues("accepted").Inc()
	case errors.Is(err, errDenied):
		a.metrics.reviews.WithLabelValues("refused").Inc()
	default:
		a.metrics.reviews.WithLabelValues("error").Inc()
	}
	return node, err
}

// errDenied marks a verdict of the API server against a token, as opposed
// to a failure to ask.
var errDenied = fmt.Errorf("agent %w", server.ErrTokenRefused)

// extraNodeName is the key of TokenReview's user.extra that names the node
// a token is bound to.
const extraNodeName = "authentication.kubernetes.io/node-name"

// ask sends one TokenReview, and returns the node the token is bound to.
func (a *Authenticator) ask(ctx context.Context, token string) (string, error) {
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if a.audience != "" {
		review.Spec.Audiences = []string{a.audience}
	}
	res, err := a.client.Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("review agent token with the API server: %w", err)
	}
	st := res.Status
	switch {
	case !st.Authenticated:
		return "", fmt.Errorf("%w: agent token not valid: %s", errDenied, orNone(st.Error))
	case a.audience != "" && !slices.Contains(st.Audiences, a.audience):
		return "", fmt.Errorf("%w: agent token not for audience %q (it is for %v): set the agents' token audience to %q", errDenied, a.audience, st.Audiences, a.audience)
	case st.User.Username != a.username:
		return "", fmt.Errorf("%w: agent token is %s's, not %s's", errDenied, st.User.Username, a.username)
	}
	if nodes := st.User.Extra[extraNodeName]; len(nodes) == 1 {
		return nodes[0], nil
	}
	return "", nil
}

// claims are the claims of a JWT that the precheck reads.
type claims struct {
	Sub      string   `json:"sub"`
	Exp      *int64   `json:"exp"`
	Nbf      *int64   `json:"nbf"`
	Audience audience `json:"aud"`
}

// audience is a JWT's aud claim: a string or a list of them.
type audience []string

func (au *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*au = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor a list of strings")
	}
	*au = many
	return nil
}

// precheck refuses, without a review, a token that the API server would
// surely refuse as the agents' service-account token for the audience: one
// that is not a signed JWT, whose subject is another account, that expired
// or is not yet valid (by more than clockSkew), or whose aud lacks the
// audience. Both bound tokens and legacy secret tokens carry sub, and
// bound tokens aud and exp; a token without aud is left to the review. It reads; it verifies no signature: the
// review does.
func (a *Authenticator) precheck(token string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return fmt.Errorf("%w: not a signed JWT (want three dot-separated parts)", errDenied)
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil {
		return fmt.Errorf("%w: JWT header: %w", errDenied, err)
	}
	if header.Alg == "" || strings.EqualFold(header.Alg, "none") {
		return fmt.Errorf("%w: JWT not signed (alg %q)", errDenied, header.Alg)
	}
	var c claims
	if err := decodeSegment(parts[1], &c); err != nil {
		return fmt.Errorf("%w: JWT claims: %w", errDenied, err)
	}
	now := a.cfg.Clock.Now()
	switch {
	case c.Sub != a.username:
		return fmt.Errorf("%w: agent token is for %q, not %s", errDenied, c.Sub, a.username)
	case c.Exp != nil && now.After(time.Unix(*c.Exp, 0).Add(clockSkew)):
		return fmt.Errorf("%w: agent token expired at %v", errDenied, time.Unix(*c.Exp, 0).UTC())
	case c.Nbf != nil && now.Add(clockSkew).Before(time.Unix(*c.Nbf, 0)):
		return fmt.Errorf("%w: agent token not valid before %v", errDenied, time.Unix(*c.Nbf, 0).UTC())
	case a.audience != "" && c.Audience != nil && !slices.Contains(c.Audience, a.audience):
		// Without aud (a legacy secret token) the API server decides:
		// such a token is for the API server's own audiences.
		return fmt.Errorf("%w: agent token not for audience %q (it is for %v): set the agents' token audience to %q", errDenied, a.audience, []string(c.Audience), a.audience)
	}
	return nil
}

// decodeSegment decodes one base64url segment of a JWT as JSON into v.
func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return fmt.Errorf("not base64url: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return nil
}

// expiry reads the exp claim of a JWT without checking it (the API server
// did): a cached acceptance must not outlive the token.
func expiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(*claims.Exp, 0), true
}

// metrics of the reviews.
type metrics struct {
	prechecked prometheus.Counter
	throttled  prometheus.Gauge
	reviews    *prometheus.CounterVec
	pending    prometheus.Gauge
	overloaded prometheus.Counter
	hits       prometheus.Counter
	entries    prometheus.Gauge
	inFlight   prometheus.Gauge
	latency    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	ours := metric.Prefix{Namespace: "servercount", Subsystem: "server"}
	m := &metrics{
		prechecked: ours.Counter("token_prechecks_refused_total",
			"Agent tokens refused without a TokenReview: not a signed JWT, of another subject, expired, not yet valid, or without the audience."),
		throttled: ours.Gauge("token_reviews_throttled",
			"TokenReviews waiting for --token-review-qps to let them be sent."),
		reviews: ours.CounterVec("token_reviews_total",
			"TokenReviews sent to the API server for agent tokens, by result: accepted, refused, error.", "result"),
		pending: ours.Gauge("token_reviews_pending",
			"TokenReviews started and not yet over, sent or waiting for a slot; at most 32 sent and 1024 waiting."),
		overloaded: ours.Counter("token_reviews_overloaded_total",
			"Agent tokens refused at once, unreviewed, because the review queue was full."),
		hits: ours.Counter("token_review_cache_hits_total",
			"Agent tokens judged from the review cache, without a TokenReview."),
		entries: ours.Gauge("token_review_cache_entries",
			"Verdicts in the review cache."),
		inFlight: ours.Gauge("token_reviews_in_flight",
			"TokenReviews sent and not yet answered."),
		latency: ours.Histogram("token_review_duration_seconds",
			"Time for the API server to answer a TokenReview.", prometheus.ExponentialBuckets(0.001, 4, 8)),
	}
	if err := metric.Register(reg, "token review metrics", m.prechecked, m.throttled, m.reviews, m.pending, m.overloaded, m.hits, m.entries, m.inFlight, m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

func orNone(s string) string {
	if s == "" {
		return "the API server gave no reason"
	}
	return s
}
