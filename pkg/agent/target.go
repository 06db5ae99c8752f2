package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/servercount/servercount/pkg/servercounter"
)

// CountSource says how the agent combines the server counts it knows: its
// Counter's, and the serverCount headers of the servers it connects to.
type CountSource string

// Count sources.
const (
	// CountSourceDefault aims for the largest count received lately when
	// RespectReceivedServerCount is set and a server has sent one, else
	// for the Counter's count.
	CountSourceDefault CountSource = "default"
	// CountSourceMax aims for the larger of the Counter's count and the
	// largest count received lately: for mixed fleets during a migration,
	// where some servers report a static count and DNS knows better, or
	// the other way round.
	CountSourceMax CountSource = "max"
)

// ParseCountSource parses "default" or "max" (--server-count-source).
func ParseCountSource(s string) (CountSource, error) {
	switch CountSource(s) {
	case CountSourceDefault, CountSourceMax:
		return CountSource(s), nil
	}
	return "", fmt.Errorf("unknown server count source %q: use default or max", s)
}

// DialMode says where the agent dials proxy-servers.
type DialMode string

// Dial modes.
const (
	// DialLoadBalancer dials ServerAddress, usually a load balancer that
	// picks a server at random: reaching N servers takes N x H(N) dials on
	// average (the coupon collector), since a dial that lands on a server
	// already connected is wasted.
	DialLoadBalancer DialMode = "lb"
	// DialResolved dials each address that Config.Endpoints returns, one
	// server per dial: reaching N servers takes N dials.
	DialResolved DialMode = "resolved"
)

// ParseDialMode parses "lb" or "resolved" (--server-dial-mode).
func ParseDialMode(s string) (DialMode, error) {
	switch DialMode(s) {
	case DialLoadBalancer, DialResolved:
		return DialMode(s), nil
	}
	return "", fmt.Errorf("unknown server dial mode %q: use lb (through --proxy-server-host) or resolved (each address --server-count-dns resolves to)", s)
}

// Target sources, the labels of servercount_agent_target_server_count:
// the servercounter.Source names of the Counter's result (static, dns,
// fallback, override), or received.
const sourceReceived = "received"

// targetPolicy decides the server count the agent aims for. It is the one
// place that does.
//
// Increases are taken at once: a new server should be connected soon. A
// decrease is taken only once lower counts have been seen for holdDown,
// and then to the largest of them, so that a single short or empty answer
// (NXDOMAIN for a moment during a rollout, an old server reporting an old
// count) never drops the target. The target is never below 1.
type targetPolicy struct {
	counter         servercounter.ServerCounter
	respectReceived bool
	source          CountSource
	window          int
	holdDown        time.Duration
	now             func() time.Time

	mu sync.Mutex // guards the fields below
	// received are the last window counts received, oldest first.
	received []int
	// current is the target in force; 0 before the first.
	current int
	// lower is the largest count seen since lowerSince, when counts began
	// to be below current; lowerSince is zero while they are not.
	lower      int
	lowerSince time.Time
}

// received records the serverCount header of a newly connected server.
func (p *targetPolicy) observeReceived(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received = append(p.received, n)
	if len(p.received) > p.window {
		p.received = p.received[len(p.received)-p.window:]
	}
}

// target returns the count to aim for and its source.
func (p *targetPolicy) target(ctx context.Context) (int, string) {
	counted, countedSrc := p.counted(ctx)

	p.mu.Lock()
	defer p.mu.Unlock()
	received := -1
	for _, n := range p.received {
		received = max(received, n)
	}
	want, src := counted, countedSrc
	switch {
	case p.source == CountSourceMax && received > counted:
		want, src = received, sourceReceived
	case p.source == CountSourceDefault && p.respectReceived && received >= 0:
		want, src = received, sourceReceived
	}
	want = max(want, 1)

	now := p.now()
	switch {
	case want >= p.current:
		p.current, p.lowerSince = want, time.Time{}
	case p.lowerSince.IsZero():
		p.lower, p.lowerSince = want, now
	default:
		p.lower = max(p.lower, want)
	}
	if !p.lowerSince.IsZero() && now.Sub(p.lowerSince) >= p.holdDown {
		p.current, p.lowerSince = p.lower, time.Time{}
	}
	return p.current, src
}

// counted returns the Counter's count and where it came from. A Counter
// that can tell (a cache in front of DNS) says dns, fallback or override.
func (p *targetPolicy) counted(ctx context.Context) (int, string) {
	if c, ok := p.counter.(servercounter.Counter); ok {
		if res, err := c.Count(ctx); err == nil {
			return res.Count, res.Source.String()
		}
	}
	return p.counter.CountServers(), servercounter.SourceStatic.String()
}
