package agent

import (
	"fmt"
	"sync"
	"time"

	"github.com/servercount/servercount/pkg/servercounter"
)

// TargetPolicy says which server count the agent aims for: the count of
// its [Config.Counter], the serverCount headers of the servers it
// connects to, or the larger of the two. Sources beyond those (DNS,
// Kubernetes leases, several combined) are the Counter's business, so a
// new source needs no new policy.
type TargetPolicy int

// Target policies.
const (
	// TargetReceived aims for the largest serverCount received in the last
	// [Config.ReceivedWindow] handshakes, as upstream agents do, and for
	// the Counter's count before any server has answered. The zero value.
	TargetReceived TargetPolicy = iota
	// TargetCounted aims for the Counter's count and ignores received
	// counts: for an agent that counts servers itself, through DNS.
	TargetCounted
	// TargetMax aims for the larger of the Counter's count and the largest
	// received lately: for mixed fleets during a migration, where some
	// servers report a static count and the Counter knows better, or the
	// other way round.
	TargetMax
)

// String returns "received", "counted" or "max".
func (p TargetPolicy) String() string {
	switch p {
	case TargetReceived:
		return "received"
	case TargetCounted:
		return "counted"
	case TargetMax:
		return "max"
	}
	return fmt.Sprintf("TargetPolicy(%d)", int(p))
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
	// DialResolved dials each address listed by the Counter's result
	// ([servercounter.Result.Endpoints]), one server per dial: reaching N
	// servers takes N dials.
	DialResolved DialMode = "resolved"
)

// ParseDialMode parses "lb" or "resolved" (--server-dial-mode).
func ParseDialMode(s string) (DialMode, error) {
	if m := DialMode(s); m.valid() {
		return m, nil
	}
	return "", fmt.Errorf("unknown server dial mode %q: use lb (through --proxy-server-host) or resolved (each address --server-count-dns resolves to)", s)
}

func (m DialMode) valid() bool { return m == DialLoadBalancer || m == DialResolved }

// sourceReceived labels a target taken from received counts in
// servercount_agent_target_server_count; the other labels are the
// servercounter.Source names of the Counter's result.
const sourceReceived = "received"

// targetPolicy decides the server count the agent aims for. It is the one
// place that does.
//
// Increases are taken at once: a new server should be connected soon. A
// decrease is taken only once lower counts have been seen for holdDown,
// and then to the largest of them, so that a single short or empty answer
// (NXDOMAIN for a moment during a rollout, an old server reporting an old
// count) never drops the target. The target is never below 1 and never
// above maxCount.
type targetPolicy struct {
	policy   TargetPolicy
	window   int
	holdDown time.Duration
	// maxCount caps every count, received or counted, before the policy
	// weighs them: a serverCount header is whatever a peer sends, and
	// TargetMax would otherwise let it override the cap.
	maxCount int
	now      func() time.Time

	mu sync.Mutex // guards the fields below
	// received are the last window counts received, oldest first.
	received []int
	held     heldTarget
}

// heldTarget is the target in force and the hold-down of a decrease.
type heldTarget struct {
	// current is the target in force; 0 before the first.
	current int
	// lower is the largest count seen since lowerSince, when counts began
	// to be below current; lowerSince is zero while they are not.
	lower      int
	lowerSince time.Time
}

// observeReceived records the serverCount header of a newly connected
// server.
func (p *targetPolicy) observeReceived(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received = append(p.received, p.clamp(n))
	if len(p.received) > p.window {
		p.received = p.received[len(p.received)-p.window:]
	}
}

// target returns the count to aim for, given the Counter's latest result,
// and the source that decided it, and moves the hold-down on: only the
// sync loop calls it.
func (p *targetPolicy) target(counted servercounter.Result) (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, src := p.next(counted)
	p.held = held
	return held.current, src
}

// peek returns what target would, and changes nothing.
func (p *targetPolicy) peek(counted servercounter.Result) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, _ := p.next(counted)
	return held.current
}

// next weighs counted and the received counts, and returns the target
// and hold-down that follow from them now. p.mu is held.
func (p *targetPolicy) next(counted servercounter.Result) (heldTarget, string) {
	received := -1
	for _, n := range p.received {
		received = max(received, n)
	}
	want, src := counted.Count, counted.Source.String()
	switch {
	case p.policy == TargetMax && received > want,
		p.policy == TargetReceived && received >= 0:
		want, src = received, sourceReceived
	}
	want = max(p.clamp(want), 1)
	now, h := p.now(), p.held
	switch {
	case want >= h.current:
		h.current, h.lowerSince = want, time.Time{}
	case h.lowerSince.IsZero():
		h.lower, h.lowerSince = want, now
	default:
		h.lower = max(h.lower, want)
	}
	if !h.lowerSince.IsZero() && now.Sub(h.lowerSince) >= p.holdDown {
		h.current, h.lowerSince = h.lower, time.Time{}
	}
	return h, src
}

// clamp caps n at maxCount; a maxCount of 0 or less means no cap.
func (p *targetPolicy) clamp(n int) int {
	if p.maxCount > 0 {
		return min(n, p.maxCount)
	}
	return n
}
