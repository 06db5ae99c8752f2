// Package tokenreview authenticates proxy-agents the Kubernetes way: an
// agent presents a service-account token, and the proxy-server asks the
// API server whether it is valid, for the expected audience and service
// account (a TokenReview). It implements server.TokenAuthenticator.
package tokenreview

import (
	"context"
	"errors"
	"fmt"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
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
}

// Authenticator checks agent tokens with TokenReviews. It is safe for
// concurrent use.
type Authenticator struct {
	client   kubernetes.Interface
	audience string
	username string
}

// New returns an Authenticator for cfg.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Namespace == "" || cfg.ServiceAccount == "" {
		return nil, errors.New("token review needs the agents' service account: set --agent-namespace and --agent-service-account")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("build API server client (--kubeconfig %q): %w", cfg.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("build API server client: %w", err)
	}
	return &Authenticator{
		client:   client,
		audience: cfg.Audience,
		username: "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
	}, nil
}

// AuthenticateToken accepts token if the API server says it is valid, for
// the audience, and of the agents' service account.
func (a *Authenticator) AuthenticateToken(ctx context.Context, token string) error {
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if a.audience != "" {
		review.Spec.Audiences = []string{a.audience}
	}
	res, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("review agent token with the API server: %w", err)
	}
	st := res.Status
	switch {
	case !st.Authenticated:
		return fmt.Errorf("agent token not valid: %s", orNone(st.Error))
	case a.audience != "" && !slices.Contains(st.Audiences, a.audience):
		return fmt.Errorf("agent token not for audience %q (it is for %v): set the agents' token audience to %q", a.audience, st.Audiences, a.audience)
	case st.User.Username != a.username:
		return fmt.Errorf("agent token is %s's, not %s's", st.User.Username, a.username)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "the API server gave no reason"
	}
	return s
}
