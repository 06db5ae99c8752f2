package wire_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/servercount/servercount/pkg/wire"
)

func TestParseHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   time.Duration
		wantOK bool
	}{
		{name: "absent"},
		{name: "five seconds", values: []string{"5s"}, want: 5 * time.Second, wantOK: true},
		{name: "the least", values: []string{"10ms"}, want: wire.MinHeartbeat, wantOK: true},
		{name: "the most", values: []string{"1h"}, want: wire.MaxHeartbeat, wantOK: true},
		{name: "too often", values: []string{"9ms"}},
		{name: "too seldom", values: []string{"1h0m1s"}},
		{name: "zero", values: []string{"0s"}},
		{name: "negative", values: []string{"-5s"}},
		{name: "a bare number", values: []string{"5"}},
		{name: "garbage", values: []string{"soon"}},
		{name: "two values", values: []string{"5s", "6s"}},
		{name: "absurdly long", values: []string{"00000000000000000000000000000000005s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := wire.ParseHeartbeat(tc.values)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestHeartbeatRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{wire.MinHeartbeat, wire.DefaultHeartbeat, 1500 * time.Millisecond, wire.MaxHeartbeat} {
		got, ok := wire.ParseHeartbeat([]string{wire.FormatHeartbeat(d)})
		assert.True(t, ok, d)
		assert.Equal(t, d, got)
		assert.NoError(t, wire.CheckHeartbeat(d))
	}
	assert.NoError(t, wire.CheckHeartbeat(-1), "-1 turns heartbeats off")
	for _, d := range []time.Duration{0, -2, time.Millisecond, 2 * time.Hour} {
		assert.ErrorContains(t, wire.CheckHeartbeat(d), "want 10ms to 1h0m0s, or -1 for none", d)
	}
	assert.Equal(t, 12500*time.Millisecond, wire.Silence(wire.DefaultHeartbeat))
	assert.Equal(t, "HEARTBEAT", wire.PacketTypeName(wire.PacketHeartbeat))
}
