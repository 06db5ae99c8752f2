package tokenreview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/servercount/servercount/pkg/server"
)

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
