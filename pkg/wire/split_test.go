package wire_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/wire"
)

// SplitData cuts into pieces of at most MaxDataPayload, in order, copies
// the pieces of an oversized packet (so that none keeps the message
// alive), passes small data as it is and stops when asked.
func TestSplitData(t *testing.T) {
	big := make([]byte, 3*wire.MaxDataPayload+5)
	for i := range big {
		big[i] = byte(i % 251)
	}
	var pieces [][]byte
	wire.SplitData(big, func(p []byte) bool { pieces = append(pieces, p); return true })
	require.Len(t, pieces, 4)
	for _, p := range pieces {
		assert.LessOrEqual(t, len(p), wire.MaxDataPayload)
	}
	want := bytes.Clone(big)
	assert.Equal(t, want, bytes.Join(pieces, nil))
	clear(big) // a piece that aliased the message would change too
	assert.Equal(t, want, bytes.Join(pieces, nil), "a piece aliases the message")
	copy(big, want)

	small := []byte("hello")
	var got [][]byte
	wire.SplitData(small, func(p []byte) bool { got = append(got, p); return true })
	require.Len(t, got, 1)
	assert.Same(t, &small[0], &got[0][0], "small data is copied for nothing")

	wire.SplitData(nil, func([]byte) bool { t.Fatal("called for no data"); return true })

	n := 0
	wire.SplitData(big, func([]byte) bool { n++; return false })
	assert.Equal(t, 1, n, "went on after fn returned false")
}
