package tunnelbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
)

var echoAddr = flag.String("tunnelbench.echo", "", "serve a byte echo on this loopback address until killed: the peer process of BenchmarkUpstream's crossing measurement")

// Crossings between processes that a new tunnel adds to a direct
// connection's way to its first byte, each a wake-up of a reader blocked
// in the receiving process. HTTP CONNECT: CONNECT (client to server),
// DIAL_REQ (server to agent), DIAL_RSP (agent to server), the 200 (server
// to client), the GET (client, server, agent, target: three) and the
// first byte back (target, agent, server, client: three), ten in all, of
// which the direct connection has two already (its GET and its first
// byte): eight more. The agent's connect to the target is the kernel's on
// loopback, with no wake-up of the target. A gRPC frontend adds its
// HTTP/2 handshake, a round trip before the client sends DIAL_REQ: two
// more.
var crossings = map[string]int{"connect": 8, "grpc": 10}

// TestEchoPeer is not a test but the peer process of the crossing
// measurement, run by startEcho as a copy of this test binary: it echoes
// every byte on -tunnelbench.echo until it is killed. Without that flag it
// skips.
func TestEchoPeer(t *testing.T) {
	if *echoAddr == "" {
		t.Skip("the peer process of BenchmarkUpstream's crossing measurement; it runs only with -tunnelbench.echo")
	}
	ln, err := net.Listen("tcp", *echoAddr)
	if err != nil {
		t.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// startEcho starts the echo peer process and returns a connection to it.
// Both end with b.
func startEcho(b *testing.B) net.Conn {
	b.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(nettest.FreePorts(b, 1)[0])
	proctest.Start(b, os.Args[0], "-test.run=^TestEchoPeer$", "-tunnelbench.echo="+addr)
	ctx, cancel := context.WithTimeout(b.Context(), readyTimeout)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			b.Cleanup(func() { _ = c.Close() })
			return c
		}
		if ctx.Err() != nil {
			b.Fatalf("the echo peer on %s did not answer within %v: %v", addr, readyTimeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// crossing sends one byte to the echo peer and waits for it to come back:
// two crossings between idle processes. It returns half the round trip.
func crossing(c net.Conn) (time.Duration, error) {
	var buf [1]byte
	if err := c.SetDeadline(time.Now().Add(opTimeout)); err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := c.Write(buf[:]); err != nil {
		return 0, fmt.Errorf("send a byte to the echo peer: %w", err)
	}
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, fmt.Errorf("read the echo peer's byte: %w", err)
	}
	return time.Since(start) / 2, nil
}
