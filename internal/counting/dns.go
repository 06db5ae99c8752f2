package counting

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/flagvalue"
	"github.com/servercount/servercount/internal/metric"
	"github.com/servercount/servercount/internal/outage"
	"github.com/servercount/servercount/pkg/servercounter"
)

// DNSOptions are the --server-count-dns flags, which both binaries have.
type DNSOptions struct {
	Name        string
	Type        servercounter.RecordType
	Servers     []string
	CacheTTL    time.Duration
	CacheTTLMin time.Duration
	CacheTTLMax time.Duration
	// RetryMax caps the back-off between failed lookups.
	RetryMax time.Duration
	Fallback int
	// Logger receives, at level 0, when DNS counting starts to fail and
	// when it recovers (not a flag). NewOptions sets klog's global logger.
	Logger klog.Logger
}

// NewDNSOptions returns the defaults.
func NewDNSOptions() *DNSOptions {
	return &DNSOptions{
		Type:        servercounter.TypeAuto,
		CacheTTLMin: servercounter.DefaultMinExpiry,
		CacheTTLMax: servercounter.DefaultMaxExpiry,
		RetryMax:    servercounter.DefaultRetryMax,
		Fallback:    servercounter.DefaultFallback,
		Logger:      klog.Background(),
	}
}

// AddFlags adds the flags to fs. withFallback adds --fallback-server-count;
// the proxy-server uses its --server-count as the fallback instead.
func (o *DNSOptions) AddFlags(fs *pflag.FlagSet, withFallback bool) {
	fs.StringVar(&o.Name, "server-count-dns", o.Name, "count proxy-servers from this DNS name: their headless Service, e.g. proxy-server.kube-system.svc.cluster.local, or _agent._tcp.proxy-server.kube-system.svc.cluster.local for SRV")
	flagvalue.Var(fs, &o.Type, "server-count-dns-type", o.Type.String(), parseRecordType, "records to count: auto (srv for names starting with _, else ip), srv, a, aaaa, ip (A and AAAA, the larger family)")
	fs.StringSliceVar(&o.Servers, "server-count-dns-server", o.Servers, "nameservers as host:port (default: those of /etc/resolv.conf)")
	fs.DurationVar(&o.CacheTTL, "server-count-cache-ttl", o.CacheTTL, "how long a DNS count stays fresh (0: the answer's TTL, bounded by --server-count-cache-ttl-min and -max)")
	fs.DurationVar(&o.CacheTTLMin, "server-count-cache-ttl-min", o.CacheTTLMin, "shortest time a DNS count stays fresh, and the first wait after a failed lookup")
	fs.DurationVar(&o.CacheTTLMax, "server-count-cache-ttl-max", o.CacheTTLMax, "longest time a DNS count stays fresh")
	fs.DurationVar(&o.RetryMax, "server-count-dns-retry-max", o.RetryMax, "longest wait between failed DNS lookups: the wait doubles from --server-count-cache-ttl-min after each failure, drawn at random from its upper half, and the last good count stays in use")
	if withFallback {
		fs.IntVar(&o.Fallback, "fallback-server-count", o.Fallback, "server count to use until DNS has answered")
	}
}

// parseRecordType parses --server-count-dns-type.
func parseRecordType(s string) (servercounter.RecordType, error) {
	t, err := servercounter.ParseRecordType(s)
	if err != nil {
		return 0, errors.New("use auto, srv, a, aaaa or ip")
	}
	return t, nil
}

// Enabled reports whether --server-count-dns was given.
func (o *DNSOptions) Enabled() bool { return o.Name != "" }

// Validate returns every problem with the flags, each naming its flag.
// The name and nameservers are checked by servercounter.Config.Validate,
// as the counter will check them, so that a typo is refused with the
// flag's name at parse time (exit 2) rather than once the program runs.
func (o *DNSOptions) Validate() []error {
	var errs []error
	if o.CacheTTL < 0 || o.CacheTTLMin <= 0 || o.CacheTTLMax < o.CacheTTLMin {
		errs = append(errs, fmt.Errorf("invalid cache TTLs (--server-count-cache-ttl %v, -min %v, -max %v): want 0 < min <= max and a TTL of 0 or more", o.CacheTTL, o.CacheTTLMin, o.CacheTTLMax))
	}
	if o.RetryMax <= 0 || o.RetryMax < o.CacheTTLMin {
		errs = append(errs, fmt.Errorf("invalid --server-count-dns-retry-max %v: must be positive and at least --server-count-cache-ttl-min %v, the first wait after a failure", o.RetryMax, o.CacheTTLMin))
	}
	if o.Fallback < 1 {
		errs = append(errs, fmt.Errorf("invalid --fallback-server-count %d: must be at least 1", o.Fallback))
	}
	if !o.Enabled() {
		if len(o.Servers) > 0 || o.CacheTTL != 0 {
			errs = append(errs, errors.New("--server-count-dns-server and --server-count-cache-ttl need --server-count-dns"))
		}
		return errs
	}
	return append(errs, flagErrors(o.config(0).Validate(), dnsFlags)...)
}

// dnsFlags name the flag of each servercounter.Config field the DNS
// flags set.
var dnsFlags = map[string]string{"Name": "--server-count-dns", "Servers": "--server-count-dns-server", "Type": "--server-count-dns-type", "Max": "--server-count-max"}

// flagErrors rewrites the *servercounter.ConfigError among err (one, or
// joined) to name the flag of their field; others are kept as they are.
func flagErrors(err error, flags map[string]string) []error {
	if err == nil {
		return nil
	}
	all := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		all = j.Unwrap()
	}
	for i, e := range all {
		var ce *servercounter.ConfigError
		if errors.As(e, &ce) && flags[ce.Field] != "" {
			all[i] = fmt.Errorf("invalid %s %s: %s", flags[ce.Field], ce.Value, ce.Reason)
		}
	}
	return all
}

// config is the counter's configuration, its count clamped to max (0: no
// bound).
func (o *DNSOptions) config(max int) servercounter.Config {
	return servercounter.Config{Name: o.Name, Type: o.Type, Servers: o.Servers, Max: max}
}

// Build returns a DNS counter behind a cache that refreshes in the
// background, answering fallback until DNS has answered and never more
// than max (--server-count-max), with its metrics registered on reg under
// servercount_<subsystem>_. Close the cache when done.
func (o *DNSOptions) Build(reg prometheus.Registerer, subsystem string, fallback, max int) (*servercounter.CachedServerCounter, error) {
	dc, err := servercounter.NewDNSServerCounter(o.config(max))
	if err != nil {
		return nil, fmt.Errorf("--server-count-dns: %w", err)
	}
	m, err := newMetrics(reg, subsystem)
	if err != nil {
		return nil, err
	}
	m.outage, m.logger, m.name = outage.New("count proxy-servers through DNS (--server-count-dns)", nil), o.Logger, o.Name
	cache, err := servercounter.NewCachedServerCounter(dc, servercounter.CacheConfig{
		Expiry: o.CacheTTL, MinExpiry: o.CacheTTLMin, MaxExpiry: o.CacheTTLMax, RetryMax: o.RetryMax,
		Fallback: fallback, Observe: m.observe, // refreshed in the background, every expiry spread
	})
	if err != nil {
		return nil, err
	}
	m.cache.Store(cache)
	return cache, nil
}

// metrics of a DNS count. Names:
//
//	servercount_<subsystem>_dns_lookups_total{outcome}  counter  DNS counts by outcome: records, nxdomain, nodata, or the failure kind
//	servercount_<subsystem>_dns_server_count            gauge    servers in the last good DNS answer (after the clamp)
//	servercount_<subsystem>_server_count_age_seconds    gauge    age of the count the cache answers (0 before the first)
//	servercount_<subsystem>_dns_backoff_seconds         gauge    the wait after the last lookup, if it failed (0 after a success)
//	servercount_<subsystem>_dns_retry_timestamp_seconds gauge    when that wait ends, in Unix seconds (0 after a success)
type metrics struct {
	lookups *prometheus.CounterVec
	count   prometheus.Gauge
	age     prometheus.GaugeFunc
	// backoff and retryAt read the cache's back-off at each scrape.
	backoff, retryAt prometheus.GaugeFunc
	// cache is the cache the metrics are of; nil until Build made it.
	cache atomic.Pointer[servercounter.CachedServerCounter]
	// learnt is when the last good answer was learnt: a time that keeps
	// its monotonic reading, so that a step of the wall clock does not
	// make the count look an hour old, or younger than it is.
	learnt atomic.Pointer[time.Time]
	// outage logs failed refreshes at level 0, once when they start and
	// once when they end: an agent that cannot reach DNS keeps its last
	// count and would otherwise say nothing. Set before the first
	// refresh.
	outage *outage.Outage
	logger klog.Logger
	name   string
}

// outcomes are every value of the lookups' outcome label, as the library
// names them.
var outcomes = []fmt.Stringer{
	servercounter.OutcomeRecords, servercounter.OutcomeNXDomain, servercounter.OutcomeNoData,
	servercounter.ErrorTimeout, servercounter.ErrorServerFailure, servercounter.ErrorRefused,
	servercounter.ErrorMalformed, servercounter.ErrorNetwork,
}

func newMetrics(reg prometheus.Registerer, subsystem string) (*metrics, error) {
	ours := metric.Prefix{Namespace: "servercount", Subsystem: subsystem}
	m := &metrics{
		lookups: ours.CounterVec("dns_lookups_total",
			"DNS server counts by outcome: records, nxdomain, nodata, or the kind of failure.", "outcome"),
		count: ours.Gauge("dns_server_count",
			"Servers in the last good DNS answer, after the --server-count-max clamp."),
	}
	m.age = ours.GaugeFunc("server_count_age_seconds",
		"Age of the server count learnt from DNS; 0 before the first answer.", m.ageSeconds)
	m.backoff = ours.GaugeFunc("dns_backoff_seconds",
		"How long the DNS count waits after its last lookup, which failed, before the next (doubling up to --server-count-dns-retry-max); 0 after a success.", func() float64 {
			wait, _ := m.backoffNow()
			return wait.Seconds()
		})
	m.retryAt = ours.GaugeFunc("dns_retry_timestamp_seconds",
		"When the DNS count's wait after a failed lookup ends, in Unix seconds; 0 after a success.", func() float64 {
			if _, until := m.backoffNow(); !until.IsZero() {
				return float64(until.UnixNano()) / 1e9
			}
			return 0
		})
	for _, o := range outcomes {
		m.lookups.WithLabelValues(o.String())
	}
	if err := metric.Register(reg, "DNS count metrics", m.lookups, m.count, m.age, m.backoff, m.retryAt); err != nil {
		return nil, err
	}
	return m, nil
}

// observe counts one refresh of the cache: its outcome, or the kind of
// failure, and the count of a good answer.
func (m *metrics) observe(res servercounter.Result, err error) {
	var de *servercounter.DNSError
	if m.outage != nil {
		if err != nil {
			m.outage.Failed(m.logger, err, "name", m.name)
		} else {
			m.outage.Recovered(m.logger, "name", m.name, "count", res.Count)
		}
	}
	switch {
	case errors.As(err, &de):
		m.lookups.WithLabelValues(de.Kind.String()).Inc()
	case err != nil:
		// The refresh ended before any query was answered or failed.
		m.lookups.WithLabelValues(servercounter.ErrorTimeout.String()).Inc()
	default:
		m.lookups.WithLabelValues(res.Outcome.String()).Inc()
		m.count.Set(float64(res.Count))
		at := res.At
		m.learnt.Store(&at)
	}
}

func (m *metrics) ageSeconds() float64 {
	at := m.learnt.Load()
	if at == nil {
		return 0
	}
	return time.Since(*at).Seconds()
}

// backoffNow is the cache's back-off: zero before Build made the cache.
func (m *metrics) backoffNow() (time.Duration, time.Time) {
	if c := m.cache.Load(); c != nil {
		return c.Backoff()
	}
	return 0, time.Time{}
}
