package lease

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/servercount/servercount/pkg/clock"
	"github.com/servercount/servercount/pkg/servercounter"
)

// RequestTimeout bounds each request to the API server (a watch: beyond
// the time the API server itself gives it): an API server that accepts
// connections and never answers must cost a retry, not a hang.
const RequestTimeout = 10 * time.Second

// Defaults shared by agents and servers, as upstream's.
const (
	// DefaultNamespace is where leases are published and counted.
	DefaultNamespace = "kube-system"
	// DefaultLabelSelector selects the proxy-servers' leases.
	DefaultLabelSelector = "k8s-app=konnectivity-server"
)

// Client reads and writes the Leases of one namespace. client-go's
// clientset.CoordinationV1().Leases(namespace) is one; so is a client that
// knows only this API group, which spares a program the memory of
// client-go's registry of every group.
type Client interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// CounterConfig configures a [Counter]. The zero value of each field but
// Client means its default.
type CounterConfig struct {
	// Client reaches the Leases of the namespace that holds them
	// (upstream's default is DefaultNamespace).
	Client Client
	// LabelSelector selects the leases to count; default
	// DefaultLabelSelector.
	LabelSelector string
	// Clock tells when a lease expires; nil means the real clock.
	Clock clock.Clock
	// Observe, when set, is called after each list and each watch call to
	// the API server: metrics hook in here. It must return quickly.
	Observe func(Call)
}

// Call is one request to the API server: a [Counter]'s list or watch, a
// [Publisher]'s get, create, update, list or delete.
type Call struct {
	// Verb is the request: "list", "watch", "get", "create", "update" or
	// "delete".
	Verb string
	// Code is the HTTP status code of the answer: 200 for a success, 0
	// when no answer came.
	Code int
	// Reason is the API server's reason for a failure (metav1.StatusReason),
	// empty for a success or when there was none.
	Reason string
	// Duration is how long the call took; for a watch, until it was
	// established.
	Duration time.Duration
	// Culled is set on a [Publisher]'s delete of an expired lease.
	Culled bool
}

// Counter counts the valid leases of the proxy-servers, kept up to date by
// an informer (a list, then a watch) on the API server.
//
// A lease is valid until renewTime (else acquireTime) plus
// leaseDurationSeconds; one without a duration or without either time is
// never valid. Clock skew between a lease's holder and this process is
// handled as [renewal.expiry] says: a renewal this process saw happen is
// valid for leaseDurationSeconds from when it saw it.
//
// Count answers an error, never a count, before the first list has ended
// and while the API server cannot be listed or watched: the caller keeps
// its last good count rather than trusting leases that nobody can renew
// in its view. When the API server answers again, the leases that were
// valid when it stopped count for one more lease duration, so that an
// outage longer than a lease does not read as every server gone. Changed signals every change of the count, including the
// expiry of a lease that was not renewed.
//
// A Counter is safe for concurrent use. Close stops it.
type Counter struct {
	cfg      CounterConfig
	informer cache.SharedIndexInformer
	synced   func() bool
	cancel   context.CancelFunc
	done     chan struct{}

	mu sync.Mutex // guards the fields below
	// leases are the leases in the informer's store, by name, and valid
	// holds those valid when last looked at, soonest expiry first: the
	// count is valid's length. Each event costs O(log n): a recount of
	// every lease per event made the first list of 16,000 leases
	// quadratic.
	leases map[string]*counted
	valid  expiryHeap
	count  int
	// expiry recounts when the next valid lease expires, armedFor.
	expiry   clock.Timer
	armedFor time.Time
	// apiErr is the last list or watch failure; nil once a list or watch
	// has succeeded since. apiDown is when the failures began.
	apiErr  error
	apiDown time.Time
	changed chan struct{}
}

var (
	_ servercounter.Counter  = (*Counter)(nil)
	_ servercounter.Notifier = (*Counter)(nil)
)

// plainListWatch makes the informer list with plain LISTs, as upstream's
// does, rather than through a watch that streams the current leases
// first: an API server that has just restarted accepts such a watch long
// before it sends the leases (a minute was seen), and the count would
// read as known, from stale leases, in between.
type plainListWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported tells client-go's reflector not to use
// watch-list for this source.
func (plainListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// errNotSynced is Count's error before the first list has ended.
var errNotSynced = errors.New("lease: the first list of leases has not ended yet")

// NewCounter starts counting the leases cfg describes.
func NewCounter(cfg CounterConfig) (*Counter, error) {
	cfg.LabelSelector = cmp.Or(cfg.LabelSelector, DefaultLabelSelector)
	if cfg.Client == nil {
		return nil, errors.New("lease: no Kubernetes client to count leases with")
	}
	if _, err := labels.Parse(cfg.LabelSelector); err != nil {
		return nil, fmt.Errorf("lease: invalid label selector %q: %w", cfg.LabelSelector, err)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	c := &Counter{cfg: cfg, done: make(chan struct{}), leases: map[string]*counted{}, changed: make(chan struct{})}
	leases := cfg.Client
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = cfg.LabelSelector
			ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
			defer cancel()
			start := time.Now()
			l, err := leases.List(ctx, opts)
			c.called(ctx, "list", start, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = cfg.LabelSelector
			// A watch lives as long as the API server's own timeout for
			// it (the reflector asks for 5 to 10 minutes), and a little
			// more: an API server that never answers cannot hold it for
			// ever.
			life := RequestTimeout
			if opts.TimeoutSeconds != nil {
				life += time.Duration(*opts.TimeoutSeconds) * time.Second
			}
			wctx, cancel := context.WithTimeout(ctx, life)
			start := time.Now()
			w, err := leases.Watch(wctx, opts)
			c.called(ctx, "watch", start, err)
			if err != nil {
				cancel()
				return nil, err
			}
			return c.observeErrors(ctx, w, cancel), nil
		},
	}
	c.informer = cache.NewSharedIndexInformer(plainListWatch{lw}, &coordinationv1.Lease{}, 0, cache.Indexers{})
	// The store keeps only what counting needs, not whole Leases.
	if err := c.informer.SetTransform(slim); err != nil {
		return nil, fmt.Errorf("lease: watch leases: %w", err)
	}
	handler, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.update(obj) },
		UpdateFunc: func(_, obj any) { c.update(obj) },
		DeleteFunc: c.remove,
	})
	if err != nil {
		return nil, fmt.Errorf("lease: watch leases: %w", err)
	}
	// Synced once the handler, not only the store, has every lease of the
	// first list: the count is the handler's.
	c.synced = handler.HasSynced
	if err := c.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		c.failed(ctx, err)
	}); err != nil {
		return nil, fmt.Errorf("lease: watch leases: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		var wg sync.WaitGroup
		wg.Go(func() { c.signalFirstSync(ctx) })
		c.informer.RunWithContext(ctx)
		wg.Wait()
	}()
	return c, nil
}

// WaitSynced waits until the first list has been counted, for a caller
// that has no other source to use meanwhile (a one-off count), or until
// ctx ends.
func (c *Counter) WaitSynced(ctx context.Context) error {
	for {
		changed := c.Changed() // before the check: a sync after it signals
		if c.synced() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			c.mu.Lock()
			err := c.apiErr
			c.mu.Unlock()
			return errors.Join(errNotSynced, err, ctx.Err())
		}
	}
}

// signalFirstSync signals Changed once the first list has been counted,
// whatever the count, so that a caller whose Count answered "not synced"
// reads again then rather than at its next poll. It looks every 10 ms
// (cache.WaitForCacheSync looks every 100 ms).
func (c *Counter) signalFirstSync(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !c.synced() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.signal()
}

// Count returns the number of valid leases, with Source
// servercounter.SourceLeases. Before the first list has ended it answers
// an error at once, and Changed signals when that list has been counted.
func (c *Counter) Count(context.Context) (servercounter.Result, error) {
	if !c.synced() {
		// No wait for the first list: a caller with another source (DNS,
		// the servers' counts) must not be held up by a silent API
		// server. Changed signals once the list has been counted.
		c.mu.Lock()
		err := c.apiErr
		c.mu.Unlock()
		return servercounter.Result{}, errors.Join(errNotSynced, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiErr != nil {
		return servercounter.Result{}, fmt.Errorf("lease: count unknown while the API server cannot be watched: %w", c.apiErr)
	}
	return servercounter.Result{Count: c.count, Found: c.count, Source: servercounter.SourceLeases, At: c.cfg.Clock.Now()}, nil
}

// Changed returns a channel that is closed when the count changes, or when
// the API server becomes reachable again or unreachable. Call it again
// after each change for the next one.
func (c *Counter) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Close stops watching and waits for the informer to end.
func (c *Counter) Close() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expiry != nil {
		c.expiry.Stop()
	}
	return nil
}

// slim returns the part of a Lease that counting needs: its name and
// namespace (the store's key), resource version, and renewal.
func slim(obj any) (any, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return obj, nil // a tombstone: its lease was slimmed already
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.Name, Namespace: l.Namespace, ResourceVersion: l.ResourceVersion},
		Spec: coordinationv1.LeaseSpec{
			AcquireTime:          l.Spec.AcquireTime,
			RenewTime:            l.Spec.RenewTime,
			LeaseDurationSeconds: l.Spec.LeaseDurationSeconds,
		},
	}, nil
}

func (c *Counter) update(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Clock.Now()
	e := c.leases[l.Name]
	if e == nil {
		e = &counted{index: -1}
		c.leases[l.Name] = e
		e.renewal = renewalOf(l, nil, now)
	} else {
		e.renewal = renewalOf(l, &e.renewal, now)
	}
	c.place(e, now)
	c.recount(now)
}

func (c *Counter) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.leases[l.Name]; e != nil {
		if e.index >= 0 {
			heap.Remove(&c.valid, e.index)
		}
		delete(c.leases, l.Name)
	}
	c.recount(c.cfg.Clock.Now())
}

// signal wakes the watchers of Changed. c.mu must be held.
func (c *Counter) signal() {
	close(c.changed)
	c.changed = make(chan struct{})
}
