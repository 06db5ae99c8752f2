package flow

import (
	"bytes"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/wire"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

func TestWindowTakesWhatThereIs(t *testing.T) {
	w := NewWindow(100)
	assert.Equal(t, 60, w.Take(60, nil))
	assert.Equal(t, 40, w.Take(60, nil), "a Take gets what is left, not nothing")
	w.Give(25)
	assert.Equal(t, 25, w.Take(60, nil))
	w.Give(0)
	w.Give(-5)
	done := make(chan struct{})
	close(done)
	assert.Equal(t, 0, w.Take(60, done), "no credit and done closed")
}

// A Take with no credit waits for a Give, and a Close ends it.
func TestWindowTakeWaits(t *testing.T) {
	w := NewWindow(0)
	got := make(chan int)
	go func() { got <- w.Take(10, nil) }()
	w.Give(7)
	select {
	case n := <-got:
		assert.Equal(t, 7, n)
	case <-time.After(waitFor):
		t.Fatal("Take did not wake on Give")
	}

	go func() { got <- w.Take(10, nil) }()
	w.Close()
	select {
	case n := <-got:
		assert.Equal(t, 0, n)
	case <-time.After(waitFor):
		t.Fatal("Take did not wake on Close")
	}
	w.Give(5)
	assert.Equal(t, 0, w.Take(10, nil), "a closed window gives nothing")
}

// A peer granting absurd amounts cannot overflow the credit.
func TestWindowGrantsAreCapped(t *testing.T) {
	w := NewWindow(wire.MaxTunnelWindow)
	for range 4 {
		w.Give(wire.MaxTunnelWindow)
	}
	assert.Equal(t, wire.MaxTunnelWindow, w.Take(2*wire.MaxTunnelWindow, nil))
}

func TestQueueCoalescesInOrder(t *testing.T) {
	q := NewQueue(1000)
	var want []byte
	for i := range 50 {
		b := bytes.Repeat([]byte{byte(i)}, 10)
		require.NoError(t, q.Put(b))
		want = append(want, b...)
	}
	var got []byte
	for len(got) < len(want) {
		b, ok := q.Next(128, nil)
		require.True(t, ok)
		assert.LessOrEqual(t, len(b), 128)
		got = append(got, b...)
		q.Release(len(b))
	}
	assert.Equal(t, want, got)
}

// The window counts what is queued, what the writer holds and what it has
// written but not yet granted back; a grant makes room again.
func TestQueueEnforcesTheWindow(t *testing.T) {
	q := NewQueue(100)
	require.NoError(t, q.Put(make([]byte, 60)))
	require.NoError(t, q.Put(make([]byte, 40)))
	assert.ErrorIs(t, q.Put([]byte{1}), ErrWindowExceeded)

	b, ok := q.Next(30, nil)
	require.True(t, ok)
	assert.ErrorIs(t, q.Put([]byte{1}), ErrWindowExceeded, "bytes being written still count")
	assert.Equal(t, 30, q.Release(len(b)), "30 of 100 is over a quarter: granted at once")
	select {
	case <-q.Room():
	default:
		t.Fatal("a grant did not signal room")
	}
	require.NoError(t, q.Put(make([]byte, 30)))
	assert.ErrorIs(t, q.Put([]byte{1}), ErrWindowExceeded)

	b, _ = q.Next(10, nil)
	assert.Equal(t, 0, q.Release(len(b)), "10 of 100 is under a quarter: kept back")
	assert.ErrorIs(t, q.Put(make([]byte, 11)), ErrWindowExceeded, "kept-back bytes still count")
	require.NoError(t, q.Put(make([]byte, 0)), "nothing to queue is fine")
}

// heldMemory returns the bytes of memory q's segments hold.
func (q *Queue) heldMemory() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, s := range q.segs {
		n += cap(s.b)
	}
	return n
}

// Whatever the pattern of packet sizes, a full queue holds little more
// than twice its window; a drained one holds nothing.
func TestQueueMemoryIsBoundedByItsWindow(t *testing.T) {
	const window = 1 << 20
	for _, tc := range []struct {
		name  string
		sizes []int
	}{
		{"tiny", []int{1}},
		{"small", []int{700}},
		{"tiny after kept", []int{keepSize, 1}},
		{"two tiny after kept", []int{keepSize, 1, 1}},
		{"just under kept", []int{keepSize - 1, 1}},
		{"large", []int{32 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue(window)
			for i := 0; ; i++ {
				if err := q.Put(make([]byte, tc.sizes[i%len(tc.sizes)])); err != nil {
					require.ErrorIs(t, err, ErrWindowExceeded)
					break
				}
			}
			assert.LessOrEqual(t, q.heldMemory(), 2*window+window/8, "a full queue holds too much memory")
			for {
				b, ok := q.Next(32<<10, nil)
				require.True(t, ok)
				q.Release(len(b))
				if q.heldMemory() == 0 {
					break
				}
			}
			assert.Empty(t, q.segs, "a drained queue keeps segments")
		})
	}
}

// Without flow control (NewBoundedQueue) every byte written frees its
// room at once, as a packet queue did: a full queue takes more as soon as
// the writer has written one piece.
func TestBoundedQueueFreesRoomPerWrite(t *testing.T) {
	q := NewBoundedQueue(4 * 32 << 10)
	for range 4 {
		require.NoError(t, q.Put(make([]byte, 32<<10)))
	}
	assert.ErrorIs(t, q.Put(make([]byte, 32<<10)), ErrWindowExceeded)
	b, ok := q.Next(32<<10, nil)
	require.True(t, ok)
	assert.Equal(t, len(b), q.Release(len(b)))
	select {
	case <-q.Room():
	default:
		t.Fatal("writing a piece did not signal room")
	}
	require.NoError(t, q.Put(make([]byte, 32<<10)), "no room after a piece was written")
}

// A large piece goes to the writer as it came, without a copy; small ones
// are coalesced.
func TestQueueKeepsLargePieces(t *testing.T) {
	q := NewQueue(1 << 20)
	large := bytes.Repeat([]byte{7}, keepSize)
	require.NoError(t, q.Put(large))
	require.NoError(t, q.Put([]byte("ab")))
	require.NoError(t, q.Put([]byte("cd")))
	b, ok := q.Next(1<<20, nil)
	require.True(t, ok)
	assert.Same(t, &large[0], &b[0], "a large piece was copied")
	b, _ = q.Next(1<<20, nil)
	assert.Equal(t, "abcd", string(b), "small pieces were not coalesced")

	// A large piece that does not fit the writer's chunk is copied in
	// part, in order.
	require.NoError(t, q.Put(nettest.Pattern(0, 10000)))
	var got []byte
	for len(got) < 10000 {
		b, _ := q.Next(3000, nil)
		got = append(got, b...)
	}
	assert.Equal(t, nettest.Pattern(0, 10000), got)
}

func TestQueueCloseWriteDrainsThenEnds(t *testing.T) {
	q := NewQueue(100)
	require.NoError(t, q.Put([]byte("last words")))
	q.CloseWrite()
	assert.ErrorIs(t, q.Put([]byte("x")), ErrClosed)
	b, ok := q.Next(100, nil)
	require.True(t, ok)
	assert.Equal(t, "last words", string(b))
	_, ok = q.Next(100, nil)
	assert.False(t, ok, "a drained, write-closed queue reports its end")
}

func TestQueueCloseDropsAndWakes(t *testing.T) {
	q := NewQueue(100)
	ended := make(chan bool)
	go func() {
		_, ok := q.Next(10, nil)
		ended <- ok
	}()
	// Wait until Next is blocked: nothing to do but let it run; Close
	// wakes it whether or not it has started waiting.
	assert.Equal(t, 0, q.Close())
	select {
	case ok := <-ended:
		assert.False(t, ok)
	case <-time.After(waitFor):
		t.Fatal("Next did not wake on Close")
	}

	q = NewQueue(100)
	require.NoError(t, q.Put(make([]byte, 42)))
	assert.Equal(t, 42, q.Close(), "Close reports what it dropped")
	assert.ErrorIs(t, q.Put([]byte{1}), ErrClosed)
	done := make(chan struct{})
	close(done)
	q = NewQueue(100)
	_, ok := q.Next(10, done)
	assert.False(t, ok, "Next gives up when done closes")
}
