package lease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestRenewalExpiry(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.MicroTime { return &metav1.MicroTime{Time: now.Add(d)} }
	lease := func(renew, acquire *metav1.MicroTime, secs *int32) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: renew, AcquireTime: acquire, LeaseDurationSeconds: secs}}
	}
	tests := []struct {
		name      string
		l         *coordinationv1.Lease
		prev      *renewal
		wantValid bool
		wantEnd   time.Time
	}{
		{name: "renewed 10s ago for 30s", l: lease(at(-10*time.Second), nil, ptr.To[int32](30)), wantValid: true, wantEnd: now.Add(20 * time.Second)},
		{name: "acquired, never renewed", l: lease(nil, at(-10*time.Second), ptr.To[int32](30)), wantValid: true, wantEnd: now.Add(20 * time.Second)},
		{name: "renew time wins over acquire time", l: lease(at(-5*time.Second), at(-50*time.Second), ptr.To[int32](30)), wantValid: true, wantEnd: now.Add(25 * time.Second)},
		{name: "no duration is invalid, not a crash", l: lease(at(0), nil, nil)},
		{name: "zero duration", l: lease(at(0), nil, ptr.To[int32](0))},
		{name: "negative duration", l: lease(at(0), nil, ptr.To[int32](-5))},
		{name: "neither time", l: lease(nil, nil, ptr.To[int32](30))},
		{name: "found long expired", l: lease(at(-time.Hour), nil, ptr.To[int32](30)), wantValid: true, wantEnd: now.Add(-time.Hour + 30*time.Second)},
		{
			// The holder's clock is 2 minutes behind: its renewTime looks
			// expired, but this process saw it change just now.
			name: "renewal seen under clock skew", l: lease(at(-2*time.Minute), nil, ptr.To[int32](30)),
			prev:      &renewal{at: now.Add(-2*time.Minute - 15*time.Second), duration: 30 * time.Second},
			wantValid: true, wantEnd: now.Add(30 * time.Second),
		},
		{
			name: "unchanged renewal keeps when it was seen", l: lease(at(-2*time.Minute), nil, ptr.To[int32](30)),
			prev:      &renewal{at: now.Add(-2 * time.Minute), duration: 30 * time.Second, seen: now.Add(-20 * time.Second)},
			wantValid: true, wantEnd: now.Add(10 * time.Second),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			end, ok := renewalOf(tc.l, tc.prev, now).expiry()
			assert.Equal(t, tc.wantValid, ok)
			if tc.wantValid {
				assert.Equal(t, tc.wantEnd, end)
			}
		})
	}
}
