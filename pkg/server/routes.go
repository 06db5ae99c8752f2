package server

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync"
)

// Tiers of a stream for a new dial, best first.
const (
	// tierReady: a stream the agent serves on.
	tierReady = iota
	// tierDraining: the agent sent DRAIN; it still serves.
	tierDraining
	// tierUnresponsive: the agent does not answer dials.
	tierUnresponsive
	// tiers is the number of tiers, and the tier of a stream or agent
	// outside a pool.
	tiers
)

// routes indexes the agent streams for choosing one for a dial, so that a
// dial costs a map lookup and a random index, never a scan of the agents:
// at 5,000 agents a scan took a third of a millisecond, and identifiers an
// agent makes up could make it longer. It has a lock of its own because a
// choice must not wait on Server.mu, which every dial's answer and every
// tunnel's end takes; Server.mu, when held, is taken first.
//
// The default and defaultRoute strategies pick a random agent among those
// of the best tier (ready, then draining, then unresponsive), and that
// agent's oldest stream of its best tier: a draining or unresponsive
// agent gets dials only when no better one can take them. destHost picks
// the oldest stream of the best tier that claims the host, as upstream
// does: the first agent to claim a host holds it while it is connected,
// and a later claimant gets none of its dials.
type routes struct {
	mu sync.Mutex
	// agents holds every agent with a stream, by agentID: the one index
	// of the agent streams by agent.
	agents map[string]*routeAgent
	// nextSeq orders the streams by age (agentStream.seq).
	nextSeq uint64
	// all and defaultRoute are the agents the default and defaultRoute
	// strategies pick among.
	all, defaultRoute agentPool
	// hosts holds, by hostKey, the streams that claim a host, ipv4 or
	// ipv6 identifier.
	hosts map[string]*streamPool
}

// routeAgent is one agentID's place in the routes.
type routeAgent struct {
	// streams are the agent's streams, oldest first.
	streams []*agentStream
	// slot is the agent's place in routes.all and routes.defaultRoute.
	slot [pools]poolSlot
}

// The agent pools, as indexes of routeAgent.slot.
const (
	poolAll = iota
	poolDefaultRoute
	pools
)

// poolSlot is where an agent is in an agentPool: tier is tiers when it is
// not in it.
type poolSlot struct{ tier, index int }

// agentPool holds agents by tier, in no order: a pick is a random index.
type agentPool struct {
	kind   int // poolAll or poolDefaultRoute
	byTier [tiers][]*routeAgent
}

// streamPool holds the streams that claim one host, by tier, oldest first.
type streamPool struct {
	byTier [tiers][]*agentStream
}

func newRoutes() *routes {
	return &routes{
		agents:       map[string]*routeAgent{},
		all:          agentPool{kind: poolAll},
		defaultRoute: agentPool{kind: poolDefaultRoute},
		hosts:        map[string]*streamPool{},
	}
}

// add registers be, the newest stream: it claims be.hostKeys. It returns,
// for each host that a stream of another agent claimed first, that
// stream: be gets none of that host's dials while it is connected; or
// errTooManyStreams, registering nothing, when be's agent holds
// MaxStreamsPerAgent.
func (r *routes) add(be *agentStream) (shadowedBy map[string]*agentStream, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.agents[be.agentID]
	if a != nil && len(a.streams) >= MaxStreamsPerAgent {
		return nil, errTooManyStreams
	}
	r.nextSeq++
	be.seq = r.nextSeq
	if a == nil {
		a = &routeAgent{slot: [pools]poolSlot{{tier: tiers}, {tier: tiers}}}
		r.agents[be.agentID] = a
	}
	a.streams = append(a.streams, be)
	be.route = a
	be.routeTier = tierReady
	for _, k := range be.hostKeys {
		p := r.hosts[k]
		if p == nil {
			p = &streamPool{}
			r.hosts[k] = p
		}
		if first := p.holder(be.agentID); first != nil {
			if shadowedBy == nil {
				shadowedBy = map[string]*agentStream{}
			}
			shadowedBy[k] = first
		}
		p.insert(be)
	}
	r.placeLocked(a)
	return shadowedBy, nil
}

// streams returns how many streams agentID has.
func (r *routes) streams(agentID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a := r.agents[agentID]; a != nil {
		return len(a.streams)
	}
	return 0
}

// remove unregisters be.
func (r *routes) remove(be *agentStream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := be.route
	if a == nil {
		return
	}
	be.route = nil
	a.streams = slices.DeleteFunc(a.streams, func(b *agentStream) bool { return b == be })
	for _, k := range be.hostKeys {
		if p := r.hosts[k]; p != nil {
			p.delete(be, be.routeTier)
			if p.empty() {
				delete(r.hosts, k)
			}
		}
	}
	r.placeLocked(a)
	if len(a.streams) == 0 {
		delete(r.agents, be.agentID)
	}
}

// setDraining moves be, whose agent sent DRAIN on it (be.draining is
// set), to its tier.
func (r *routes) setDraining(be *agentStream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retierLocked(be)
}

// setUnresponsive records whether be is taken for unresponsive.
func (r *routes) setUnresponsive(be *agentStream, unresponsive bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	be.routeUnresponsive = unresponsive
	r.retierLocked(be)
}

// retierLocked moves be to the tier its state gives. Called with r.mu
// held.
func (r *routes) retierLocked(be *agentStream) {
	tier := tierReady
	switch {
	case be.routeUnresponsive:
		tier = tierUnresponsive
	case be.draining.Load():
		tier = tierDraining
	}
	old := be.routeTier
	if be.route == nil || old == tier {
		return
	}
	be.routeTier = tier
	for _, k := range be.hostKeys {
		p := r.hosts[k]
		p.delete(be, old)
		p.insert(be)
	}
	r.placeLocked(be.route)
}

// placeLocked puts a in the agent pools by its streams' best tiers.
// Called with r.mu held.
func (r *routes) placeLocked(a *routeAgent) {
	best := [pools]int{tiers, tiers}
	for _, b := range a.streams {
		best[poolAll] = min(best[poolAll], b.routeTier)
		if b.ids.DefaultRoute {
			best[poolDefaultRoute] = min(best[poolDefaultRoute], b.routeTier)
		}
	}
	r.all.place(a, best[poolAll])
	r.defaultRoute.place(a, best[poolDefaultRoute])
}

// choose picks a stream for a dial to the host of hostKey by strategies,
// tried in order, other than avoid (nil avoids none). It returns the
// stream, its tier and the strategy that found it, or a nil stream.
func (r *routes) choose(strategies []Strategy, hostKey string, avoid *agentStream) (*agentStream, int, Strategy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range strategies {
		var be *agentStream
		switch st {
		case StrategyDestHost:
			if p := r.hosts[hostKey]; p != nil {
				be = p.pick(avoid)
			}
		case StrategyDefaultRoute:
			be = r.defaultRoute.pick(avoid)
		default:
			be = r.all.pick(avoid)
		}
		if be != nil {
			return be, be.routeTier, st
		}
	}
	return nil, tiers, ""
}

// servedElsewhere reports whether a stream of an agent other than be's
// that answers dials claims one of be's hosts, for each of them.
func (r *routes) servedElsewhere(be *agentStream) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range be.hostKeys {
		p := r.hosts[k]
		if p == nil || p.firstAnswering(be.agentID) == nil {
			return false
		}
	}
	return true
}

// place moves a to tier (tiers: out of the pool).
func (p *agentPool) place(a *routeAgent, tier int) {
	s := &a.slot[p.kind]
	if s.tier == tier {
		return
	}
	if s.tier < tiers {
		list := p.byTier[s.tier]
		last := list[len(list)-1]
		list[s.index] = last
		last.slot[p.kind].index = s.index
		list[len(list)-1] = nil
		p.byTier[s.tier] = list[:len(list)-1]
	}
	s.tier = tier
	if tier < tiers {
		s.index = len(p.byTier[tier])
		p.byTier[tier] = append(p.byTier[tier], a)
	}
}

// pick returns the oldest stream of the best tier of a random agent of
// the best tier, other than avoid: when avoid's agent is the only one of
// its tier, its best other stream competes at that stream's tier.
func (p *agentPool) pick(avoid *agentStream) *agentStream {
	var fallback *agentStream // avoid's agent's best other stream
	for tier, list := range p.byTier {
		if fallback != nil && fallback.routeTier <= tier {
			return fallback
		}
		n := len(list)
		if n == 0 {
			continue
		}
		i := rand.IntN(n)
		if avoid != nil && list[i] == avoid.route {
			if n == 1 {
				fallback = list[i].best(p.kind, avoid)
				continue
			}
			i = (i + 1 + rand.IntN(n-1)) % n
		}
		return list[i].best(p.kind, nil)
	}
	return fallback
}

// best is a's oldest stream of its best tier in pool kind, other than
// avoid.
func (a *routeAgent) best(kind int, avoid *agentStream) *agentStream {
	var best *agentStream
	for _, b := range a.streams {
		if b == avoid || kind == poolDefaultRoute && !b.ids.DefaultRoute {
			continue
		}
		if best == nil || b.routeTier < best.routeTier {
			best = b
		}
	}
	return best
}

// insert adds be at its tier, in age order.
func (p *streamPool) insert(be *agentStream) {
	list := p.byTier[be.routeTier]
	i, _ := slices.BinarySearchFunc(list, be.seq, func(b *agentStream, seq uint64) int { return cmp.Compare(b.seq, seq) })
	p.byTier[be.routeTier] = slices.Insert(list, i, be)
}

// delete removes be from tier.
func (p *streamPool) delete(be *agentStream, tier int) {
	list := p.byTier[tier]
	if i, ok := slices.BinarySearchFunc(list, be.seq, func(b *agentStream, seq uint64) int { return cmp.Compare(b.seq, seq) }); ok {
		p.byTier[tier] = slices.Delete(list, i, i+1)
	}
}

func (p *streamPool) empty() bool {
	for _, list := range p.byTier {
		if len(list) > 0 {
			return false
		}
	}
	return true
}

// pick returns the oldest stream of the best tier, other than avoid.
func (p *streamPool) pick(avoid *agentStream) *agentStream {
	for _, list := range p.byTier {
		for _, b := range list[:min(len(list), 2)] {
			if b != avoid {
				return b
			}
		}
	}
	return nil
}

// holder returns the oldest ready stream of an agent other than
// agentID's, which a new ready stream of agentID's comes after, or nil.
func (p *streamPool) holder(agentID string) *agentStream {
	for _, b := range p.byTier[tierReady] {
		if b.agentID != agentID {
			return b
		}
	}
	return nil
}

// firstAnswering is first among the streams that answer dials.
func (p *streamPool) firstAnswering(agentID string) *agentStream {
	for _, list := range p.byTier[:tierUnresponsive] {
		for _, b := range list {
			if b.agentID != agentID {
				return b
			}
		}
	}
	return nil
}
