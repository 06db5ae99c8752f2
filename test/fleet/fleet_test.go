package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitFor bounds each wait of the tests; they take seconds.
const waitFor = time.Minute

// TestFleetConvergesAndCounts starts a small fleet, waits until every
// agent holds every server, scales the servers up through DNS, and checks
// that the counters saw at least what must have happened.
func TestFleetConvergesAndCounts(t *testing.T) {
	const agents, servers = 20, 3
	// A 1 s TTL, so that the scale-up is seen within about a second.
	f := New(t, Config{Agents: agents, Servers: servers, DNSTTL: time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()

	start := f.StartAgents()
	reached, err := f.Wait(ctx, Holding(servers))
	require.NoError(t, err, "cold start")
	_, ok := Latest(start, reached)
	require.True(t, ok)

	c := f.Counts()
	t.Logf("after the cold start: %v", c)
	assert.GreaterOrEqual(t, c.Connects, int64(agents*servers), "Connect streams")
	assert.GreaterOrEqual(t, c.Handshakes, c.Connects, "TLS handshakes: one per Connect stream at least")
	assert.GreaterOrEqual(t, c.DNSQueries, int64(agents), "DNS queries: one per agent at least")
	// Every token is distinct and every server reviews each once.
	assert.GreaterOrEqual(t, c.TokenReviews, int64(agents*servers), "TokenReviews")
	assert.LessOrEqual(t, c.TokenReviews, c.Connects, "TokenReviews: at most one per stream")
	times := f.QueryTimes(start, time.Now().Add(time.Second))
	assert.Len(t, times, int(c.DNSQueries), "the query log")

	w := f.Watch()
	before := f.Counts()
	added := f.StartServer()
	f.Publish(append(f.Servers()[:servers], added)...)
	_, err = f.Wait(ctx, Holding(servers+1))
	require.NoError(t, err, "scale-up")
	assert.Equal(t, servers, w.Stop(), "fewest servers held during the scale-up")
	d := f.Counts().Sub(before)
	t.Logf("scale-up: %v", d)
	assert.GreaterOrEqual(t, d.Connects, int64(agents), "a Connect stream per agent to the new server")
	assert.Zero(t, d.StreamEnds, "streams ended during a scale-up in resolved mode")
}

func TestMaxInWindow(t *testing.T) {
	at := func(ms ...int) []time.Time {
		base := time.Unix(1000, 0)
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, base.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	tests := []struct {
		name string
		ts   []time.Time
		want int
	}{
		{name: "none", ts: nil, want: 0},
		{name: "one", ts: at(5), want: 1},
		{name: "spread", ts: at(0, 100, 200, 300), want: 1},
		{name: "burst", ts: at(0, 150, 160, 170, 249, 400), want: 4},
		{name: "edge excluded", ts: at(0, 99, 100), want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaxInWindow(tc.ts, 100*time.Millisecond); got != tc.want {
				t.Errorf("MaxInWindow = %d, want %d", got, tc.want)
			}
		})
	}
}
