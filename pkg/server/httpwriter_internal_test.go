package server

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/wire"
)

// TestHTTPWriterWritesWhatCameBeforeCloseRsp delivers DATA to an HTTP
// CONNECT tunnel's writer and, once the writer has written it and is on
// its way to finding its queue empty, a second DATA and the close right
// behind it, as a tunnel's pump delivers a tunnel's last DATA and its
// CLOSE_RSP: the client must read both before its end of stream. A writer
// that looked for data before it looked for the close could find no data,
// then the close, and end the connection with the second DATA unwritten:
// a clean EOF after the first packet (seen once in 40,000 tunnels of the
// integrity run). The window is a few instructions wide: the test tries
// it thousands of times, one tunnel at a time (several at once leave the
// two cores to the test's own spinning). The old writer failed it in
// every run of 6,000 without the race detector, and in about one in
// five with it, which slows the test's side more than the writer's:
// make test runs it both ways.
func TestHTTPWriterWritesWhatCameBeforeCloseRsp(t *testing.T) {
	fs := &frontends{life: newLifecycle(), metrics: testMetrics(t), writeTimeout: time.Minute}
	t.Cleanup(fs.life.wg.Wait)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	for round := range 6000 {
		if err := lastDataBeforeClose(fs, l); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// lastDataBeforeClose runs one tunnel of the test above, through a
// connection accepted on l, and says what went wrong, if anything.
func lastDataBeforeClose(fs *frontends, l net.Listener) error {
	first, second := bytes.Repeat([]byte{1}, 512), bytes.Repeat([]byte{2}, 4<<10)
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err
	}
	defer client.Close()
	conn, err := l.Accept()
	if err != nil {
		return err
	}
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, client)
		client.Close() // as a client does: the writer waits for it (lingerClose)
		got <- n
	}()

	ht := &httpTunnel{fs: fs, data: make(chan []byte, queueSize), closed: make(chan struct{}),
		queued: queuedBytes{m: fs.metrics}, flushed: make(chan struct{})}
	ht.wmu.Lock()
	ht.client = conn
	ht.wmu.Unlock()
	ht.deliver(wire.Data(1, bytes.Clone(first)), nil)
	// Written once the count is back to 0: the writer is on its way to
	// finding data empty.
	for deadline := time.Now().Add(time.Minute); queuedNow(&ht.queued) != 0; {
		if time.Now().After(deadline) {
			return fmt.Errorf("the writer never wrote the first DATA")
		}
	}
	// What deliver and shutdown do, with nothing more in between.
	ht.data <- bytes.Clone(second)
	close(ht.closed)
	ht.kick()

	select {
	case n := <-got:
		<-ht.flushed
		if want := int64(len(first) + len(second)); n != want {
			return fmt.Errorf("the client read %d bytes and then a clean end of stream; want %d", n, want)
		}
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("the client never saw the end of the stream")
	}
}

// queuedNow is q's count.
func queuedNow(q *queuedBytes) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
