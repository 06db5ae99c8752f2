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
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/internal/kubeclient"
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
	r, v, err := a.join(key, token)
	if err != nil {
		return "", err
	}
	if r == nil {
		a.metrics.hits.Inc()
		return v.node, v.err
	}
	select {
	case <-r.done:
		return r.node, r.err
	case <-ctx.Done():
		a.leave(key, r)
		return "", fmt.Errorf("review agent token: %w", ctx.Err())
	}
}
