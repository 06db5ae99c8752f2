package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Upstream's lease timings, which agents of either kind assume.
const (
	// DefaultDuration is a published lease's leaseDurationSeconds.
	DefaultDuration = 30 * time.Second
	// DefaultRenewInterval is how often a server renews its lease.
	DefaultRenewInterval = 15 * time.Second
	// DefaultGCInterval is how often a server deletes expired leases.
	DefaultGCInterval = 15 * time.Second
)

// retryInterval is the wait after a failed renewal.
const retryInterval = time.Second

// NamePrefix starts the name of every published lease; the server ID
// follows.
const NamePrefix = "konnectivity-proxy-server-"

// PublisherConfig configures a [Publisher]. The zero value of each field
// but Client and ServerID means its default.
type PublisherConfig struct {
	// Client reaches the Leases of the namespace that holds them
	// (upstream's default is DefaultNamespace).
	Client Client
	// ServerID is the holder identity, and names the lease.
	ServerID string
	// Labels label the published lease and select the leases to collect,
	// written as a selector of equalities ("k8s-app=konnectivity-server");
	// default DefaultLabelSelector.
	Labels string
	// Duration, RenewInterval and GCInterval default to DefaultDuration,
	// DefaultRenewInterval and DefaultGCInterval.
	Duration, RenewInterval, GCInterval time.Duration
	// Observe, when set, is called after each request to the API server
	// ("get", "create", "update", "list", "delete"), with Culled set on
	// the delete of an expired lease: metrics hook in here.
	Observe func(Call)
}

// Publisher keeps a proxy-server's lease renewed, and deletes the leases
// of servers that stopped renewing theirs, as upstream's lease controller
// does.
type Publisher struct {
	cfg    PublisherConfig
	labels labels.Set
}

// NewPublisher checks cfg.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.Labels = cmp.Or(cfg.Labels, DefaultLabelSelector)
	cfg.Duration = cmp.Or(cfg.Duration, DefaultDuration)
	cfg.RenewInterval = cmp.Or(cfg.RenewInterval, DefaultRenewInterval)
	cfg.GCInterval = cmp.Or(cfg.GCInterval, DefaultGCInterval)
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("lease: no Kubernetes client to publish the lease with"))
	}
	if cfg.ServerID == "" {
		errs = append(errs, errors.New("lease: no server ID to name the lease after"))
	}
	set, err := labels.ConvertSelectorToLabelsMap(cfg.Labels)
	if err != nil || len(set) == 0 {
		errs = append(errs, fmt.Errorf("lease: invalid lease labels %q: want key=value pairs separated by commas", cfg.Labels))
	}
	if cfg.Duration < time.Second || cfg.RenewInterval <= 0 || cfg.RenewInterval >= cfg.Duration || cfg.GCInterval <= 0 {
		errs = append(errs, fmt.Errorf("lease: invalid timings (duration %v, renew every %v, collect every %v): the renewal must come well within the duration", cfg.Duration, cfg.RenewInterval, cfg.GCInterval))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Publisher{cfg: cfg, labels: set}, nil
}

// Name returns the name of the published lease.
func (p *Publisher) Name() string { return NamePrefix + p.cfg.ServerID }

// Run publishes and renews the lease and collects expired ones until ctx
// ends, then deletes its own lease, so that agents drop this server at
// once rather than after the lease expires. A failed request is logged
// and tried again at the next interval.
func (p *Publisher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("lease", p.Name())
	// A failed renewal is tried again soon, not a whole interval later:
	// after an API server outage the lease must be renewed before agents
	// judge it expired.
	renew := time.NewTimer(p.cfg.RenewInterval)
	defer renew.Stop()
	renewed := func(err error) {
		next := p.cfg.RenewInterval
		if err != nil {
			next = min(next, retryInterval)
		}
		renew.Reset(next)
	}
	gc := time.NewTicker(p.cfg.GCInterval)
	defer gc.Stop()
	var renewErr, gcErr error
	report := func(what string, last *error, err error) {
		switch {
		case err != nil && *last == nil:
			logger.Error(err, "Lease "+what+" failed; retrying")
		case err == nil && *last != nil:
			logger.Info("Lease " + what + " works again")
		}
		*last = err
	}
	err := p.renew(ctx)
	report("renewal", &renewErr, err)
	renewed(err)
	for {
		select {
		case <-ctx.Done():
			// A fresh context: ctx is done, and the delete must still go out.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			err := p.deleteOwn(dctx)
			if err != nil {
				logger.Error(err, "Deleting the lease on stop failed; it expires by itself")
			}
			return err
		case <-renew.C:
			err := p.renew(ctx)
			report("renewal", &renewErr, err)
			renewed(err)
		case <-gc.C:
			report("garbage collection", &gcErr, p.collect(ctx))
		}
	}
}

// renew creates the lease or moves its renewTime to now.
func (p *Publisher) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	leases := p.cfg.Client
	now := metav1.NewMicroTime(time.Now())
	start := time.Now()
	l, err := leases.Get(ctx, p.Name(), metav1.GetOptions{})
	p.observe("get", start, err, false)
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name(), Labels: p.labels},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(p.cfg.ServerID),
				LeaseDurationSeconds: ptr.To(int32(p.cfg.Duration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		start = time.Now()
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		p.observe("create", start, err, false)
		return wrap("create lease", err)
	}
	if err != nil {
		return wrap("get lease", err)
	}
	l.Labels = labels.Merge(l.Labels, p.labels)
	l.Spec.HolderIdentity = ptr.To(p.cfg.ServerID)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(p.cfg.Duration / time.Second))
	l.Spec.RenewTime = &now
	start = time.Now()
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	p.observe("update", start, err, false)
	return wrap("renew lease", err)
}

// collect deletes the expired leases that carry the labels, each only if
// nobody renewed it since it was listed.
func (p *Publisher) collect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	leases := p.cfg.Client
	start := time.Now()
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: p.labels.String()})
	p.observe("list", start, err, false)
	if err != nil {
		return wrap("list leases", err)
	}
	now := time.Now()
	var errs []error
	for i := range list.Items {
		l := &list.Items[i]
		if end, ok := renewalOf(l, nil, now).expiry(); ok && end.After(now) {
			continue
		}
		start := time.Now()
		err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &l.ResourceVersion}})
		p.observe("delete", start, err, err == nil)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, wrap("delete expired lease "+l.Name, err))
		}
	}
	return errors.Join(errs...)
}

// deleteOwn deletes the published lease.
func (p *Publisher) deleteOwn(ctx context.Context) error {
	start := time.Now()
	err := p.cfg.Client.Delete(ctx, p.Name(), metav1.DeleteOptions{})
	p.observe("delete", start, err, false)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return wrap("delete own lease", err)
}

func (p *Publisher) observe(verb string, start time.Time, err error, culled bool) {
	if p.cfg.Observe == nil {
		return
	}
	code, reason := statusOf(err)
	p.cfg.Observe(Call{Verb: verb, Code: code, Reason: reason, Duration: time.Since(start), Culled: culled})
}

// statusOf returns the HTTP status code and reason of a request's error:
// 200 and "" for nil, 0 when no answer came.
func statusOf(err error) (int, string) {
	if err == nil {
		return 200, ""
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return int(status.Status().Code), string(status.Status().Reason)
	}
	return 0, ""
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("lease: %s: %w", what, err)
}
