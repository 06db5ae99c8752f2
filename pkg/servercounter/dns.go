package servercounter

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/miekg/dns"
	"k8s.io/klog/v2"
)

// DNSServerCounter counts servers by the records of a DNS name, usually
// the headless Service in front of them: Kubernetes DNS answers one A or
// AAAA record per ready endpoint, and one SRV record per ready endpoint and
// named port.
//
// A DNSServerCounter is safe for concurrent use. Each Count queries the
// network; wrap it in a [CachedServerCounter] to count often.
type DNSServerCounter struct {
	cfg *resolved

	mu sync.Mutex // guards lastKind
	// lastKind is the kind of the last failure, 0 after a success; it
	// decides what to log, and how many tries the next count makes.
	lastKind ErrorKind
}

// attempts is how many tries the next count makes: Config.Attempts, or
// one after a count that failed. A caller that counts again after a
// failure is the retry (a CachedServerCounter backs off between its
// calls): tries on top of its own would multiply what a fleet asks of a
// failing DNS, where most of them meet the same failure.
func (c *DNSServerCounter) attempts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastKind != 0 {
		return 1
	}
	return c.cfg.Attempts
}

// NewDNSServerCounter returns a counter for cfg.Name. It reads resolv.conf
// once, here, and returns every problem with cfg at once.
func NewDNSServerCounter(cfg Config) (*DNSServerCounter, error) {
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	return &DNSServerCounter{cfg: r}, nil
}

// Type returns the record type counted; never TypeAuto.
func (c *DNSServerCounter) Type() RecordType { return c.cfg.Type }

// Count resolves the name and counts distinct servers in the answer: SRV
// targets, or addresses (for TypeIP, the larger of the IPv4 and IPv6
// families). NXDOMAIN and NODATA count zero.
//
// A try that fails (SERVFAIL, REFUSED, a malformed answer, a network
// error) is followed, after an exponential back-off, by a try against the
// next nameserver. A try with no answer within Config.Timeout is followed
// at once by the next, and keeps listening meanwhile: a late answer still
// counts, as it does for glibc's resolver. After Config.Attempts tries
// (one, after a count that failed: the caller's next count is the
// retry), or when ctx ends, Count returns a *DNSError.
func (c *DNSServerCounter) Count(ctx context.Context) (Result, error) {
	start := c.cfg.Clock.Now()
	res, err := c.try(ctx, c.attempts())
	if err != nil {
		c.observe(ctx, Result{}, err)
		return Result{}, err
	}
	res.Source, res.Type = SourceDNS, c.cfg.Type
	res.Count = res.Found
	if c.cfg.Max > 0 {
		res.Count = min(res.Count, c.cfg.Max)
	}
	res.Count = max(res.Count, c.cfg.Min)
	res.At = c.cfg.Clock.Now()
	res.Duration = res.At.Sub(start)
	c.observe(ctx, res, nil)
	return res, nil
}

// attempt is one try against one nameserver.
type attempt struct {
	server string
	// name is the search-list name being asked, for the error of a try
	// that times out while it runs.
	name atomic.Pointer[string]
	// res and err are its end, sent on the tries' channel.
	res Result
	err error
}

// try runs the tries of one count, up to attempts of them overlapping,
// and returns the first answer. Every try has ended when it returns.
func (c *DNSServerCounter) try(ctx context.Context, attempts int) (Result, *DNSError) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel: the tries watch ctx
	defer cancel()

	ended := make(chan *attempt, attempts) // never blocks a try
	var tries []*attempt
	start := func() {
		a := &attempt{server: c.cfg.servers[len(tries)%len(c.cfg.servers)]}
		a.name.Store(&c.cfg.names[0])
		tries = append(tries, a)
		wg.Go(func() {
			a.res, a.err = c.lookup(ctx, a.server, &a.name)
			a.res.Server = a.server
			ended <- a
		})
	}
	// MaxElapsedTime 0: Attempts and ctx bound the retries, not the
	// package's 15-minute default.
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.cfg.InitialBackoff),
		backoff.WithMaxInterval(c.cfg.MaxBackoff),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0))
	var last *DNSError
	fail := func(a *attempt, err error) *DNSError {
		f := &failure{kind: ErrorNetwork, rcode: -1, err: err}
		errors.As(err, &f)
		return &DNSError{Name: *a.name.Load(), Server: a.server, Kind: f.kind, Rcode: f.rcode, Err: f.err, Attempts: len(tries)}
	}

	start()
	wait := after(c.cfg.Clock, c.cfg.Timeout)
	defer func() { wait.Stop() }()
	// backingOff is true while wait is the back-off after the current
	// try failed, false while it is the current try's timeout.
	backingOff := false
	for {
		select {
		case a := <-ended:
			if a.err == nil {
				return a.res, nil
			}
			last = fail(a, a.err)
			if a != tries[len(tries)-1] {
				continue // an earlier try, already timed out, failed too
			}
			wait.Stop()
			if len(tries) == attempts {
				return Result{}, last
			}
			wait, backingOff = after(c.cfg.Clock, b.NextBackOff()), true
		case <-wait.C:
			if !backingOff {
				last = fail(tries[len(tries)-1], &failure{kind: ErrorTimeout, rcode: -1, err: errQueryTimeout})
				if len(tries) == attempts {
					return Result{}, last
				}
			}
			start()
			wait, backingOff = after(c.cfg.Clock, c.cfg.Timeout), false
		case <-ctx.Done():
			if last == nil {
				last = fail(tries[len(tries)-1], &failure{kind: ErrorTimeout, rcode: -1, err: errQueryTimeout})
			}
			last.Kind, last.Rcode, last.Err = ErrorTimeout, -1, errors.Join(ctx.Err(), last.Err)
			last.Attempts = len(tries)
			return Result{}, last
		}
	}
}

// lookup tries each candidate name on server, as a stub resolver walks its
// search list, storing the name it asks in asking: the first name with
// records answers. When none has, the
// answer for the name as given (made absolute) is the valid zero. A failure
// on any name fails the try: it could hide the records.
func (c *DNSServerCounter) lookup(ctx context.Context, server string, asking *atomic.Pointer[string]) (Result, error) {
	var zero Result
	absolute := strings.ToLower(dns.Fqdn(c.cfg.Name))
	for i, name := range c.cfg.names {
		asking.Store(&c.cfg.names[i])
		res, err := c.lookupName(ctx, server, name)
		if err != nil {
			return Result{}, err
		}
		if res.Outcome == OutcomeRecords {
			return res, nil
		}
		if i == 0 || name == absolute {
			zero = res
		}
	}
	return zero, nil
}

// lookupName counts the servers at one name. For TypeIP it asks for A and
// AAAA at once and counts the larger family; when one family fails and the
// other has records, as behind a server or middlebox that mishandles AAAA,
// that family's count stands, as a lower bound marked Partial.
func (c *DNSServerCounter) lookupName(ctx context.Context, server, name string) (Result, error) {
	answers, err := c.query(ctx, server, name, c.cfg.Type.DNSTypes(), 0)
	if err != nil {
		return Result{}, err
	}
	if len(answers) == 1 {
		if answers[0].err != nil {
			return Result{}, answers[0].err
		}
		return answers[0].result(name), nil
	}
	a4, a6 := answers[0], answers[1]
	switch {
	case a4.err != nil && (a6.err != nil || a6.outcome != OutcomeRecords):
		return Result{}, a4.err
	case a6.err != nil && a4.outcome != OutcomeRecords:
		return Result{}, a6.err
	case a4.err != nil:
		res := a6.result(name)
		res.Partial = true
		return res, nil
	case a6.err != nil:
		res := a4.result(name)
		res.Partial = true
		return res, nil
	}
	r4, r6 := a4.result(name), a6.result(name)
	res := r4
	if r6.Found > r4.Found {
		res = r6
	}
	res.Answer = append(r4.Answer, r6.Answer...)
	res.Truncated = r4.Truncated || r6.Truncated
	res.Transport = max(r4.Transport, r6.Transport)
	switch {
	case r4.Found > 0 && r6.Found > 0:
		res.TTL = min(r4.TTL, r6.TTL)
	case r4.Found == 0 && r6.Found == 0:
		res.TTL = min(r4.TTL, r6.TTL)
		if r4.Outcome == OutcomeNoData || r6.Outcome == OutcomeNoData {
			res.Outcome, res.Rcode = OutcomeNoData, dns.RcodeSuccess
		}
	}
	return res, nil
}

// result turns the answer for name into a Result with distinct servers
// counted and records sorted.
func (a answer) result(name string) Result {
	slices.SortFunc(a.rrs, compareRR)
	slices.SortFunc(a.extra, compareRR)
	return Result{
		Found:     countDistinct(a.rrs),
		Outcome:   a.outcome,
		Name:      name,
		TTL:       time.Duration(a.ttl) * time.Second,
		Truncated: a.truncated,
		Rcode:     a.rcode,
		Transport: a.transport,
		Answer:    a.rrs,
		Extra:     a.extra,
	}
}

// countDistinct counts distinct servers in sorted rrs, all of one type:
// SRV targets (a name may have one SRV record per port of the same
// endpoint), or addresses. An SRV target of "." means "no service" (RFC
// 2782) and is not counted.
func countDistinct(rrs []dns.RR) int {
	n := 0
	for i, rr := range rrs {
		if s, ok := rr.(*dns.SRV); ok && (s.Target == "." || s.Target == "") {
			continue
		}
		if i == 0 || sameServer(rrs[i-1], rr) != 0 {
			n++
		}
	}
	return n
}

// sameServer compares the servers that a and b name, so that records of
// one server sort together: 0 means the same server.
func sameServer(a, b dns.RR) int {
	switch a := a.(type) {
	case *dns.SRV:
		return cmp.Compare(strings.ToLower(a.Target), strings.ToLower(b.(*dns.SRV).Target))
	case *dns.A:
		return bytes.Compare(a.A.To4(), b.(*dns.A).A.To4())
	case *dns.AAAA:
		return bytes.Compare(a.AAAA.To16(), b.(*dns.AAAA).AAAA.To16())
	}
	return 0
}

// compareRR orders records by type, then server, then SRV port.
func compareRR(a, b dns.RR) int {
	if c := cmp.Compare(a.Header().Rrtype, b.Header().Rrtype); c != 0 {
		return c
	}
	if c := sameServer(a, b); c != 0 {
		return c
	}
	if sa, ok := a.(*dns.SRV); ok {
		return cmp.Compare(sa.Port, b.(*dns.SRV).Port)
	}
	return 0
}

// observe logs when a kind of failure starts or ends, never once per
// query. The cache in front logs changes of count.
func (c *DNSServerCounter) observe(ctx context.Context, res Result, err *DNSError) {
	logger := klog.FromContext(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if err.Kind != c.lastKind {
			logger.V(2).Info("DNS server count failed", "name", c.cfg.Name, "kind", err.Kind.String(), "server", err.Server, "err", err)
			c.lastKind = err.Kind
		}
		if v := logger.V(4); v.Enabled() {
			v.Info("DNS server count attempt failed", "name", c.cfg.Name, "err", err)
		}
		return
	}
	if c.lastKind != 0 {
		logger.V(2).Info("DNS server count recovered", "name", c.cfg.Name, "failure", c.lastKind.String())
		c.lastKind = 0
	}
	// Checked first: building the arguments costs allocations on every
	// count, and this is the one line per query.
	if v := logger.V(4); v.Enabled() {
		v.Info("DNS server count", "name", res.Name, "count", res.Count, "outcome", res.Outcome.String(), "server", res.Server, "transport", res.Transport.String())
	}
}
