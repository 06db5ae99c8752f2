package agent

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/servercount/servercount/pkg/servercounter"
)

// duplicateBudget sets how many duplicate dials in a row the sync loop
// retries at once: duplicateBudget x target / missing servers.
const duplicateBudget = 10

// Target returns the server count the agent would aim for now: the
// Counter's count (read once, within a sync interval, as the sync loop
// reads it) and the counts servers reported, weighed by the policy and the
// hold-down. It changes nothing: the sync loop alone moves the hold-down
// on, keeps the last count, and exports and logs the target.
func (cs *ClientSet) Target() int {
	return cs.policy.peek(cs.read(context.Background(), false))
}

// count reads the Counter once for the sync loop, and keeps the result.
func (cs *ClientSet) count(ctx context.Context) servercounter.Result {
	return cs.read(ctx, true)
}

// read reads the Counter once. A Counter that has no count yet (a lease
// informer before its first list, a DNS cache before its first answer) may
// wait for one: not longer than a sync interval, so that an API server or
// a nameserver that does not answer costs the agent its count, never its
// servers. A failed read answers the last result kept, so that an unknown
// count never replaces a known one; keep keeps a successful one.
func (cs *ClientSet) read(ctx context.Context, keep bool) servercounter.Result {
	cctx, cancel := context.WithTimeout(ctx, cs.cfg.SyncInterval)
	defer cancel()
	res, err := cs.cfg.Counter.Count(cctx)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if err != nil {
		klog.FromContext(ctx).V(4).Info("Server count unknown, keeping the last", "count", cs.lastCount.Count, "err", err)
		return cs.lastCount
	}
	if keep {
		cs.lastCount = res
	}
	return res
}

// target returns the server count aimed for given the Counter's result,
// exporting and logging changes.
func (cs *ClientSet) target(ctx context.Context, counted servercounter.Result) int {
	n, src := cs.policy.target(counted)

	cs.mu.Lock()
	changed := n != cs.lastTarget || src != cs.lastSource
	old, oldSrc := cs.lastTarget, cs.lastSource
	cs.lastTarget, cs.lastSource = n, src
	if changed {
		cs.metrics.setTarget(n, src, oldSrc)
	}
	cs.mu.Unlock()
	if changed && n != old {
		klog.FromContext(ctx).V(2).Info("Server count target changed", "oldCount", old, "newCount", n, "source", src)
	}
	return n
}

// syncLoop dials servers while fewer than the target are connected. Each
// server dial runs in a goroutine of its own (serverDials), so that an
// address whose connects hang (a black hole: up to HandshakeTimeout)
// holds up no dial to another, nor the loop.
func (cs *ClientSet) syncLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	dials := newServerDials(cs.cfg)
	defer dials.wait()
	// The change signal is taken before each round reads the count, as
	// Notifier asks: a change during the round then wakes the next wait
	// at once instead of waiting for the timer.
	notifier, _ := cs.cfg.Counter.(servercounter.Notifier)
	subscribe := func() <-chan struct{} {
		if notifier == nil {
			return nil
		}
		return notifier.Changed()
	}
	changed := subscribe()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-changed:
			logger.V(4).Info("Server count changed, syncing now")
		case <-cs.syncNow:
			logger.V(4).Info("A proxy-server is going away, syncing now")
		case d := <-dials.done:
			cs.dialEnded(d, dials)
		}
		changed = subscribe()
		wait := cs.syncRound(ctx, dials)
		cs.metrics.syncRound()
		logger.V(5).Info("Finished sync round", "wait", wait)
		timer.Reset(wait)
	}
}

// syncRound does one round of the sync loop: it starts the server dials
// the target calls for, and returns how long to wait before the next
// round unless a dial's end comes first. It reads the Counter once: the
// target and the addresses to dial come from the same result.
func (cs *ClientSet) syncRound(ctx context.Context, dials *serverDials) time.Duration {
	if cs.isDraining() {
		return cs.cfg.SyncInterval
	}
	counted := cs.count(ctx)
	target := cs.target(ctx, counted)
	serving := cs.serving()
	cs.noteServing(serving, target, cs.now())
	if serving >= target {
		// Whatever failed dials there were no longer keep the agent from
		// its target (the target may have dropped).
		cs.serverOutage.Recovered(klog.FromContext(ctx), "connected", serving, "target", target)
	}
	// How many dials to have in flight: one per missing server with an
	// address each, one at a time through a load balancer (a dial there
	// may find any server), and one now and then at the target with
	// SyncForever, which learns the count so, as upstream does.
	want := target - serving
	if cs.cfg.DialMode != DialResolved {
		want = min(want, 1)
	}
	if cs.cfg.SyncForever {
		want = max(want, 1)
	}
	now := time.Now()
	wait := cs.cfg.SyncInterval
	for dials.inFlight() < want {
		addr, ok, after := cs.dialAddress(ctx, counted, dials, now)
		if !ok {
			if after > 0 {
				wait = min(wait, after)
			}
			break
		}
		dials.start(ctx, cs, addr)
	}
	return wait
}

// dialEnded takes the outcome of a server dial: an address that failed
// waits its own back-off before it is dialled again, one that worked
// starts afresh; a duplicate (a load balancer picked a server the agent
// holds) is dialled again at once within a budget.
func (cs *ClientSet) dialEnded(d dialOutcome, dials *serverDials) {
	dials.ended(cs, d.addr)
	if d.res != dialDuplicate {
		cs.duplicates = 0
	}
	switch d.res {
	case dialOK:
		dials.succeeded(d.addr)
	case dialError:
		dials.failed(d.addr, time.Now())
	case dialDuplicate:
		// A load balancer picked a server we have: it is up, so try again
		// at once rather than waiting a sync interval per duplicate, as
		// upstream does. With m of T servers missing, a random pick finds
		// one with chance m/T, so duplicateBudget x T/m duplicates in a
		// row happen by chance about once in e^10 (2 in 100000); more
		// likely the count is higher than the servers behind the balancer,
		// and the agent waits a sync interval between dials, as upstream,
		// without growing it: the balancer answers, the servers are up.
		cs.duplicates++
		cs.mu.Lock()
		target := cs.lastTarget
		cs.mu.Unlock()
		if missing := target - cs.serving(); missing <= 0 || cs.duplicates > duplicateBudget*target/missing+1 {
			dials.holdOff(d.addr, time.Now().Add(cs.cfg.SyncInterval))
		}
	}
}
