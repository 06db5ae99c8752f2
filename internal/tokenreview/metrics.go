package tokenreview

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/servercount/servercount/internal/metric"
)

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
