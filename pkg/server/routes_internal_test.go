package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/wire"
)

// routesFixture is a routes and, beside it, the same streams kept plainly,
// for a reference choice by scanning.
type routesFixture struct {
	r       *routes
	streams []*agentStream // every registered stream, oldest first
}

// add registers a stream of agentID, or, when the agent holds
// MaxStreamsPerAgent already, checks that routes refused it and returns
// nil.
func (f *routesFixture) add(agentID string, ids wire.Identifiers) *agentStream {
	be := &agentStream{agentID: agentID, ids: ids, hostKeys: hostKeys(ids)}
	held := 0
	for _, b := range f.streams {
		if b.agentID == agentID {
			held++
		}
	}
	_, err := f.r.add(be)
	if held >= MaxStreamsPerAgent {
		if !errors.Is(err, errTooManyStreams) {
			panic(fmt.Sprintf("agent %s holds %d streams, and routes took one more (%v)", agentID, held, err))
		}
		return nil
	}
	if err != nil {
		panic(err)
	}
	f.streams = append(f.streams, be)
	return be
}

func (f *routesFixture) remove(be *agentStream) {
	f.r.remove(be)
	f.streams = slices.DeleteFunc(f.streams, func(b *agentStream) bool { return b == be })
}

// drain marks be as its agent's DRAIN does.
func (f *routesFixture) drain(be *agentStream) {
	be.draining.Store(true)
	f.r.setDraining(be)
}

// scanTier is be's tier from its state, as routes should have it.
func scanTier(be *agentStream) int {
	switch {
	case be.routeUnresponsive:
		return tierUnresponsive
	case be.draining.Load():
		return tierDraining
	}
	return tierReady
}

// acceptable returns every stream that strategy st may pick for a dial to
// host, avoiding avoid, by a scan of every stream: for destHost the one
// oldest of the best tier; for the others, of each agent of the best tier,
// that agent's oldest stream of its best tier.
func (f *routesFixture) acceptable(st Strategy, host string, avoid *agentStream) []*agentStream {
	match := func(b *agentStream) bool {
		switch st {
		case StrategyDestHost:
			return slices.Contains(b.hostKeys, hostKey(host))
		case StrategyDefaultRoute:
			return b.ids.DefaultRoute
		}
		return true
	}
	if st == StrategyDestHost {
		for tier := range tiers {
			for _, b := range f.streams {
				if b != avoid && match(b) && scanTier(b) == tier {
					return []*agentStream{b}
				}
			}
		}
		return nil
	}
	best := map[string]*agentStream{}
	for _, b := range f.streams {
		if b == avoid || !match(b) {
			continue
		}
		if cur, ok := best[b.agentID]; !ok || scanTier(b) < scanTier(cur) {
			best[b.agentID] = b
		}
	}
	for tier := range tiers {
		var out []*agentStream
		for _, b := range best {
			if scanTier(b) == tier {
				out = append(out, b)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// Through a random run of connects, disconnects, DRAINs and agents taken
// for unresponsive and back, every choice is one that a scan of every
// stream accepts.
func TestRoutesChooseAsAScanWould(t *testing.T) {
	f := &routesFixture{r: newRoutes()}
	rng := rand.New(rand.NewPCG(1, 2))
	hosts := []string{"node-a", "node-b", "10.0.0.1", "fd00::1", "node-c"}
	for step := range 5000 {
		switch op := rng.IntN(10); {
		case op < 4 || len(f.streams) == 0:
			var ids wire.Identifiers
			for range rng.IntN(3) {
				h := hosts[rng.IntN(len(hosts))]
				if a, err := netip.ParseAddr(h); err == nil && a.Is4() {
					ids.IPv4 = append(ids.IPv4, h)
				} else if err == nil {
					ids.IPv6 = append(ids.IPv6, h)
				} else {
					ids.Host = append(ids.Host, strings.ToUpper(h))
				}
			}
			ids.DefaultRoute = rng.IntN(3) == 0
			f.add(fmt.Sprintf("agent-%d", rng.IntN(8)), ids)
		case op < 6:
			f.remove(f.streams[rng.IntN(len(f.streams))])
		case op < 8:
			f.drain(f.streams[rng.IntN(len(f.streams))])
		default:
			f.r.setUnresponsive(f.streams[rng.IntN(len(f.streams))], rng.IntN(2) == 0)
		}
		for _, st := range []Strategy{StrategyDefault, StrategyDestHost, StrategyDefaultRoute} {
			host := hosts[rng.IntN(len(hosts))]
			var avoid *agentStream
			if len(f.streams) > 0 && rng.IntN(2) == 0 {
				avoid = f.streams[rng.IntN(len(f.streams))]
			}
			got, tier, _ := f.r.choose([]Strategy{st}, hostKey(host), avoid)
			want := f.acceptable(st, host, avoid)
			if len(want) == 0 {
				require.Nil(t, got, "step %d: %s to %s: want none", step, st, host)
				continue
			}
			require.NotNil(t, got, "step %d: %s to %s", step, st, host)
			require.Contains(t, want, got, "step %d: %s to %s avoiding %v", step, st, host, avoid)
			require.Equal(t, scanTier(got), tier, "step %d: tier", step)
		}
	}
	for len(f.streams) > 0 {
		f.remove(f.streams[0])
	}
	require.Empty(t, f.r.agents)
	require.Empty(t, f.r.hosts)
	for _, p := range []agentPool{f.r.all, f.r.defaultRoute} {
		for _, list := range p.byTier {
			require.Empty(t, list)
		}
	}
}

// scanChooser is the choice as it was before routes: a scan of every
// agent's streams under Server.mu, kept as the benchmarks' baseline. With
// destHost it picked at random among the claimants.
type scanChooser map[string][]*agentStream

func (sc scanChooser) choose(strategies []Strategy, address string) *agentStream {
	for _, st := range strategies {
		var match func(*agentStream) bool
		switch st {
		case StrategyDestHost:
			host := address
			if h, _, err := net.SplitHostPort(address); err == nil {
				host = h
			}
			match = func(b *agentStream) bool { return scanMatchHost(b.ids, host) }
		case StrategyDefaultRoute:
			match = func(b *agentStream) bool { return b.ids.DefaultRoute }
		}
		var byTier [tiers][]*agentStream
		for _, streams := range sc {
			var best *agentStream
			bestTier := tiers
			for _, b := range streams {
				if match != nil && !match(b) {
					continue
				}
				if t := scanTier(b); t < bestTier {
					best, bestTier = b, t
				}
			}
			if best != nil {
				byTier[bestTier] = append(byTier[bestTier], best)
			}
		}
		for _, c := range byTier {
			if len(c) > 0 {
				return c[rand.IntN(len(c))]
			}
		}
	}
	return nil
}

func scanMatchHost(ids wire.Identifiers, host string) bool {
	for _, h := range ids.Host {
		if strings.EqualFold(h, host) {
			return true
		}
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	for _, list := range [][]string{ids.IPv4, ids.IPv6} {
		for _, v := range list {
			if a, err := netip.ParseAddr(v); err == nil && a.Unmap() == addr.Unmap() {
				return true
			}
		}
	}
	return false
}

// benchFleet registers n agents, each with a node's name and address, one
// in ten with default-route; hostile adds 100 agents claiming 64
// identifiers of 253 bytes each. It returns routes and the baseline over
// the same streams.
func benchFleet(n int, hostile bool) (*routes, scanChooser) {
	f := &routesFixture{r: newRoutes()}
	sc := scanChooser{}
	add := func(id string, ids wire.Identifiers) {
		be := f.add(id, ids)
		sc[id] = []*agentStream{be}
	}
	for i := range n {
		add(fmt.Sprintf("agent-%d", i), wire.Identifiers{
			Host:         []string{fmt.Sprintf("node-%d", i)},
			IPv4:         []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)},
			DefaultRoute: i%10 == 0,
		})
	}
	if hostile {
		for i := range 100 {
			var ids wire.Identifiers
			for j := range MaxAgentIdentifiers {
				ids.Host = append(ids.Host, fmt.Sprintf("%d-%d-%s", i, j, strings.Repeat("x", maxIdentifierLen-12)))
			}
			add(fmt.Sprintf("hostile-%d", i), ids)
		}
	}
	return f.r, sc
}

// BenchmarkChoose measures the choice of a stream for a dial at 5,000
// agents, by strategy, with routes and with the scan it replaced; with
// "hostile", 100 more agents claim 64 identifiers of 253 bytes each.
//
//	go test -run '^$' -bench BenchmarkChoose -benchtime 2000x ./pkg/server
func BenchmarkChoose(b *testing.B) {
	for _, hostile := range []bool{false, true} {
		r, sc := benchFleet(5000, hostile)
		for _, st := range []Strategy{StrategyDefault, StrategyDestHost, StrategyDefaultRoute} {
			strategies := []Strategy{st}
			name := string(st)
			if hostile {
				name += "/hostile"
			}
			b.Run(name+"/routes", func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++
					addr := fmt.Sprintf("10.0.%d.%d:10250", i>>8&15, i&255)
					if be, _, _ := r.choose(strategies, dialHostKey(addr), nil); be == nil {
						b.Fatal("no stream")
					}
				}
			})
			b.Run(name+"/scan", func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++
					addr := fmt.Sprintf("10.0.%d.%d:10250", i>>8&15, i&255)
					if sc.choose(strategies, addr) == nil {
						b.Fatal("no stream")
					}
				}
			})
		}
	}
}

// A retry avoids the stream it left; when that stream's agent is the only
// one of its tier, the agent's other stream competes at its own tier: a
// draining agent beats an unresponsive stream.
func TestRoutesAvoidWeighsTheOtherStreamAtItsTier(t *testing.T) {
	f := &routesFixture{r: newRoutes()}
	x1 := f.add("x", wire.Identifiers{})
	x2 := f.add("x", wire.Identifiers{})
	y := f.add("y", wire.Identifiers{})
	f.r.setUnresponsive(x2, true)
	f.drain(y)
	for range 20 {
		got, tier, _ := f.r.choose([]Strategy{StrategyDefault}, "", x1)
		require.Same(t, y, got)
		require.Equal(t, tierDraining, tier)
	}
	f.r.setUnresponsive(x2, false)
	got, tier, _ := f.r.choose([]Strategy{StrategyDefault}, "", x1)
	require.Same(t, x2, got, "x's other stream, ready, beats draining y")
	require.Equal(t, tierReady, tier)
}
