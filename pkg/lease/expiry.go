package lease

import (
	"container/heap"
	"time"
)

// place puts e among the valid leases if its renewal is valid at now,
// and takes it out if not. c.mu must be held.
func (c *Counter) place(e *counted, now time.Time) {
	end, ok := e.renewal.expiry()
	e.end = end
	switch valid := ok && end.After(now); {
	case valid && e.index >= 0:
		heap.Fix(&c.valid, e.index)
	case valid:
		heap.Push(&c.valid, e)
	case e.index >= 0:
		heap.Remove(&c.valid, e.index)
	}
}

// recount drops the leases that have expired by now, signals a change of
// the count, and arms the timer for the next expiry. c.mu must be held.
func (c *Counter) recount(now time.Time) {
	for len(c.valid) > 0 && !c.valid[0].end.After(now) {
		heap.Pop(&c.valid)
	}
	if n := len(c.valid); n != c.count {
		c.count = n
		c.signal()
	}
	var next time.Time
	if len(c.valid) > 0 {
		next = c.valid[0].end
	}
	if next.Equal(c.armedFor) && c.expiry != nil {
		return // armed for it already
	}
	if c.expiry != nil {
		c.expiry.Stop()
		c.expiry = nil
	}
	c.armedFor = next
	if !next.IsZero() {
		c.expiry = c.cfg.Clock.AfterFunc(next.Sub(now), func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.expiry = nil
			c.recount(c.cfg.Clock.Now())
		})
	}
}

// counted is a lease in the count: its renewal, when that expires, and
// its place in the heap of valid leases (-1 when not valid).
type counted struct {
	renewal renewal
	end     time.Time
	index   int
}

// expiryHeap is a container/heap of valid leases, soonest expiry first.
type expiryHeap []*counted

func (h expiryHeap) Len() int { return len(h) }

func (h expiryHeap) Less(i, j int) bool { return h[i].end.Before(h[j].end) }

func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *expiryHeap) Push(x any) {
	e := x.(*counted)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
