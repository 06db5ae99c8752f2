package churn

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
)

// Targets are the endpoints of a run, host:port each.
type Targets struct {
	// Sink reads and discards until EOF.
	Sink string
	// Source reads one byte, the request, then writes until the write
	// fails. It waits for the request, as HTTP servers do: a target that
	// speaks first meets a race of the konnectivity-client library
	// (v0.37), whose tunnel can take DATA that comes right after the
	// DIAL_RSP for an unknown connection and close it.
	Source string
	// Closer reads a 4-byte big-endian length n, then n bytes, then
	// closes the connection (while its peer still writes).
	Closer string
	// Echo writes back what it reads.
	Echo string
}

// StartTargets starts the four targets on 127.0.0.1 in this process; they
// stop, every connection closed and every goroutine gone, when tb ends.
func StartTargets(tb testing.TB) Targets {
	tb.Helper()
	return Targets{
		Sink: nettest.Serve(tb, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }),
		Source: nettest.Serve(tb, func(c net.Conn) {
			var req [1]byte
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			buf := make([]byte, 32<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}),
		Closer: nettest.Serve(tb, func(c net.Conn) {
			var hdr [4]byte
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			_, _ = io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[:])))
		}),
		Echo: nettest.Echo(tb),
	}
}

// StartStreamer starts a target that reads one byte, the request, from
// every connection, then writes n chunks of size bytes, one every
// interval, and closes it: a stream such as `kubectl logs -f`. It stops
// when tb ends; it returns its address.
func StartStreamer(tb testing.TB, n, size int, interval time.Duration) string {
	tb.Helper()
	stop := make(chan struct{})
	addr := nettest.Serve(tb, func(c net.Conn) {
		var req [1]byte
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return
		}
		b := make([]byte, size)
		for i := range n {
			if i > 0 {
				t := time.NewTimer(interval) // the stream's pace
				select {
				case <-t.C:
				case <-stop:
					t.Stop()
					return
				}
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	})
	// Registered after Serve's, so run before it (cleanups run last
	// first): the handlers stop writing, then the listener closes.
	tb.Cleanup(func() { close(stop) })
	return addr
}

// OpenStream opens a tunnel through dial to a streamer (StartStreamer),
// asks for its stream and reads the first first bytes: a tunnel open and
// busy, for tests of what ends one. The tunnel closes when tb ends.
func OpenStream(tb testing.TB, dial Dialer, streamer string, first int) net.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	c, err := dial(ctx, streamer)
	require.NoError(tb, err, "open a tunnel to the streamer")
	tb.Cleanup(func() { _ = c.Close() })
	_, err = c.Write([]byte{'G'})
	require.NoError(tb, err, "ask for the stream")
	_, err = io.ReadFull(c, make([]byte, first))
	require.NoError(tb, err, "the stream's first %d bytes", first)
	return c
}
