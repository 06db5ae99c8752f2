package lease

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// renewal is when a lease was last renewed and for how long, as its
// holder wrote it, and when this process saw that renewal.
type renewal struct {
	// at is renewTime, else acquireTime; zero if the lease has neither.
	at time.Time
	// duration is leaseDurationSeconds; 0 if the lease has none.
	duration time.Duration
	// seen is when this process saw at change from an earlier value; zero
	// for the renewal first seen, whose age this process cannot judge by
	// its own clock.
	seen time.Time
}

// renewalOf reads l's renewal. prev is the renewal seen before for the
// same lease, or nil; now is the local time.
func renewalOf(l *coordinationv1.Lease, prev *renewal, now time.Time) renewal {
	var r renewal
	switch {
	case l.Spec.RenewTime != nil:
		r.at = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		r.at = l.Spec.AcquireTime.Time
	}
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		r.duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if prev != nil {
		r.seen = prev.seen
		if !r.at.Equal(prev.at) {
			r.seen = now
		}
	}
	return r
}

// expiry returns when r stops being valid, and false if it never is: a
// lease without a duration, or without a renew or acquire time.
//
// Clock skew: the holder's clock wrote renewTime, this process's clock
// reads it. A renewal seen to happen (renewTime changed while this process
// watched) is valid for leaseDurationSeconds from when it was seen,
// whatever the two clocks say; the renewal first seen, whose age only the
// holder's clock tells, is judged by renewTime. So a server whose clock
// runs behind the agent's keeps its lease valid as long as it renews, and
// a lease found long expired at start-up is not counted.
func (r renewal) expiry() (time.Time, bool) {
	if r.at.IsZero() || r.duration <= 0 {
		return time.Time{}, false
	}
	end := r.at.Add(r.duration)
	if !r.seen.IsZero() {
		if byUs := r.seen.Add(r.duration); byUs.After(end) {
			end = byUs
		}
	}
	return end, true
}
