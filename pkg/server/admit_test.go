package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/clocktest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// heldReviews stands for an API server that answers no TokenReview until
// the test lets it: every token waits in AuthenticateToken until release,
// and is then accepted if it is "good".
type heldReviews struct {
	release chan struct{}
	once    sync.Once
	calls   atomic.Int64
	waiting atomic.Int64
}

func newHeldReviews(t *testing.T) *heldReviews {
	h := &heldReviews{release: make(chan struct{})}
	t.Cleanup(h.open)
	return h
}

func (h *heldReviews) open() { h.once.Do(func() { close(h.release) }) }

func (h *heldReviews) AuthenticateToken(ctx context.Context, token string) error {
	h.calls.Add(1)
	h.waiting.Add(1)
	defer h.waiting.Add(-1)
	select {
	case <-h.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if token != "good" {
		return fmt.Errorf("%w: not a good token", server.ErrTokenRefused)
	}
	return nil
}

// A peer that has proven nothing holds little: 300 Connect streams on one
// connection, the first 16 each followed by a stream window of data,
// while their tokens wait for review, cost the server under 20 MiB of
// heap. The connection carries MaxAgentStreamsPerConn streams at once,
// each holding at most a stream window; the others are refused by HTTP/2.
// They cost 360 MiB when a connection's streams were unbounded.
func TestUnauthenticatedStreamsHoldNothing(t *testing.T) {
	reviews := newHeldReviews(t)
	e := startEnv(t, server.Config{Authenticator: reviews})
	before := metricstest.HeapInUse()

	cfg := e.agentTLS.Clone()
	cfg.NextProtos = []string{"h2"}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: waitFor}, "tcp", e.agentAddr, cfg)
	require.NoError(t, err)
	defer c.Close()
	fr := http2.NewFramer(c, c)
	block := adversarytest.ConnectHeaders("hostile", "bogus")
	const streams = 300
	written := make(chan int64, 1)
	go func() {
		// Writes stop when the server stops reading and the socket's
		// buffers are full: the deadline ends them.
		_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
		var n int64
		chunk := make([]byte, 16<<10)
		defer func() { written <- n }()
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil || fr.WriteSettings() != nil {
			return
		}
		for i := range streams {
			id := uint32(2*i + 1)
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil {
				return
			}
			if i >= 2*server.MaxAgentStreamsPerConn {
				// The server refuses these at once and discards what
				// comes on them: their data would cost both ends CPU
				// (TLS), not the server memory.
				continue
			}
			for range wire.StreamWindow / len(chunk) {
				if fr.WriteData(id, false, chunk) != nil {
					return
				}
				n += int64(len(chunk))
			}
		}
	}()
	n := <-written
	grown := int64(metricstest.HeapInUse()) - int64(before)
	t.Logf("offered %d MiB; the server read until the socket was full; heap grew %.1f MiB", n>>20, float64(grown)/(1<<20))
	assert.Less(t, grown, int64(20<<20), "heap held for unauthenticated streams")
	assert.LessOrEqual(t, reviews.calls.Load(), int64(server.MaxAgentStreamsPerConn), "tokens in review")
	assert.Zero(t, e.srv.Backends())
}

// connFrom is a connection to e's agent port from ip, a loopback address,
// closed when the test ends.
func connFrom(t *testing.T, e *env, ip string) *grpc.ClientConn {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: waitFor}
	cc, err := grpc.NewClient(e.agentAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.agentTLS)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// A flood of handshakes from one address holds at most
// DefaultMaxHandshakesPerAddress places in review; beyond, it is refused at once
// (ResourceExhausted), while an agent from another address still gets
// its review, and is accepted once the API server answers.
func TestHandshakesPerAddressAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	reviews := newHeldReviews(t)
	e := startEnv(t, server.Config{Registerer: reg, Authenticator: reviews})

	from := func(ip string) grpc.ClientConnInterface { return connFrom(t, e, ip) }
	dial := func(conn grpc.ClientConnInterface, id, token string) error {
		a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Conn: conn, ID: id, Token: token})
		if err == nil {
			t.Cleanup(a.Close)
		}
		return err
	}

	// The flood: each handshake on a connection of its own, as a
	// connection's handshakes are checked one at a time.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer reviews.open()
	for i := range server.DefaultMaxHandshakesPerAddress {
		conn := from("127.0.0.1")
		wg.Go(func() { _ = dial(conn, fmt.Sprint("flood-", i), "bogus") })
	}
	require.Eventually(t, func() bool { return reviews.waiting.Load() == server.DefaultMaxHandshakesPerAddress }, waitFor, time.Millisecond)
	err := dial(from("127.0.0.1"), "flood-over", "bogus")
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Equal(t, 1.0, gaugeOf(reg, "servercount_server_agent_rejections_total", map[string]string{"reason": "too_many_handshakes"})())

	// Another address is not held back by the flood.
	done := make(chan error, 1)
	go func() { done <- dial(from("127.0.0.2"), "real", "good") }()
	require.Eventually(t, func() bool { return reviews.waiting.Load() == server.DefaultMaxHandshakesPerAddress+1 }, waitFor, time.Millisecond)
	reviews.open()
	require.NoError(t, <-done)
	waitBackends(t, e, 1)
}

// One agentID holds at most MaxStreamsPerAgent streams: of 1000 streams
// of one agent, the first MaxStreamsPerAgent are served and every other
// is refused at once, holding nothing. (The first fill their connection's
// MaxAgentStreamsPerConn: the others come on a second one.)
func TestStreamsPerAgentAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	var conns [2]*grpc.ClientConn
	for i := range conns {
		cc, err := grpc.NewClient(e.agentAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.agentTLS)))
		require.NoError(t, err)
		defer cc.Close()
		conns[i] = cc
	}
	goroutines := runtime.NumGoroutine()
	refused := 0
	for i := range 1000 {
		cc := conns[min(i/server.MaxStreamsPerAgent, 1)]
		a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Conn: cc, ID: "one-agent"})
		if i < server.MaxStreamsPerAgent {
			require.NoError(t, err, "stream %d", i)
			t.Cleanup(a.Close)
			continue
		}
		require.Error(t, err, "stream %d", i)
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		refused++
	}
	assert.Equal(t, server.MaxStreamsPerAgent, e.srv.Backends())
	assert.Equal(t, float64(refused), gaugeOf(reg, "servercount_server_agent_rejections_total", map[string]string{"reason": "too_many_streams"})())
	assert.Less(t, runtime.NumGoroutine()-goroutines, 10*server.MaxStreamsPerAgent, "goroutines held after the refusals")
}

// With MaxHandshakesPerAddress negative, one address (agents behind one
// SNAT address) may have every handshake in review, and refused tokens
// from it never shut it out.
func TestHandshakesPerAddressUnbounded(t *testing.T) {
	reviews := newHeldReviews(t)
	e := startEnv(t, server.Config{Authenticator: reviews, MaxHandshakesPerAddress: -1})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer reviews.open()
	const n = server.DefaultMaxHandshakesPerAddress + 4
	for i := range n {
		wg.Go(func() {
			a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: e.agentAddr, TLS: e.agentTLS, ID: fmt.Sprint("nat-", i), Token: "good"})
			if assert.NoError(t, err) {
				t.Cleanup(a.Close)
			}
		})
	}
	require.Eventually(t, func() bool { return reviews.waiting.Load() == n }, waitFor, time.Millisecond)
	reviews.open()
	wg.Wait()
	waitBackends(t, e, n)
	for i := range 3 * 10 {
		_, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Addr: e.agentAddr, TLS: e.agentTLS, ID: fmt.Sprint("broken-", i), Token: "bad"})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "refused token %d: %v", i, err)
	}
}

// countingAuth counts the tokens a token file checks.
type countingAuth struct {
	server.TokenAuthenticator
	checks atomic.Int64
}

func (c *countingAuth) AuthenticateToken(ctx context.Context, token string) error {
	c.checks.Add(1)
	return c.TokenAuthenticator.AuthenticateToken(ctx, token)
}

// An address whose tokens are refused again and again is refused, past a
// burst of them, without a check: a flood of bogus tokens from one host
// cannot spend the reviews that every agent shares. Another address is
// still checked, and accepted.
func TestAddressWithRefusedTokensIsNotChecked(t *testing.T) {
	reg := prometheus.NewRegistry()
	auth := &countingAuth{TokenAuthenticator: tokenFileAuth(t, "good\n")}
	clk := clocktest.New(time.Now()) // the buckets refill only when it steps
	e := startEnv(t, server.Config{Registerer: reg, Authenticator: auth, Clock: clk})
	from := func(ip, id, token string) error {
		a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Conn: connFrom(t, e, ip), ID: id, Token: token})
		if err == nil {
			t.Cleanup(a.Close)
		}
		return err
	}
	var codesSeen []codes.Code
	for i := range 40 {
		codesSeen = append(codesSeen, status.Code(from("127.0.0.1", fmt.Sprint("bogus-", i), "bogus")))
	}
	// The bucket holds 10 refusals and gains one a second.
	assert.Equal(t, codes.Unauthenticated, codesSeen[0])
	assert.Equal(t, codes.ResourceExhausted, codesSeen[39], "refused without a check")
	assert.Equal(t, int64(10), auth.checks.Load(), "tokens checked of 40 refused ones: codes %v", codesSeen)
	assert.Equal(t, 30.0, gaugeOf(reg, "servercount_server_agent_rejections_total", map[string]string{"reason": "too_many_refused_tokens"})())
	clk.Step(time.Second)
	assert.Equal(t, codes.Unauthenticated, status.Code(from("127.0.0.1", "bogus-41", "bogus")), "checked again a second later")
	assert.Equal(t, codes.ResourceExhausted, status.Code(from("127.0.0.1", "bogus-42", "bogus")), "one check a second")
	assert.Equal(t, int64(11), auth.checks.Load())

	require.NoError(t, from("127.0.0.2", "real", "good"))
	waitBackends(t, e, 1)
}

// sendBeforeAuth opens a TLS connection to e's agent port from ip and
// writes, on one Connect stream whose token is "bogus", up to 4 MiB of
// DATA without reading, and returns how the server ended it: the error of
// reading to the end (nil: EOF) and of the writes. A server that keeps
// the connection open makes the read time out.
func sendBeforeAuth(t *testing.T, e *env, ip string) (readErr, writeErr error) {
	t.Helper()
	cfg := e.agentTLS.Clone()
	cfg.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: waitFor, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := tls.DialWithDialer(d, "tcp", e.agentAddr, cfg)
	if err != nil {
		return err, err
	}
	defer c.Close()
	fr := http2.NewFramer(c, c)
	block := adversarytest.ConnectHeaders("hostile", "bogus")
	wrote := make(chan error, 1)
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(waitFor))
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			wrote <- err
			return
		}
		if err := fr.WriteSettings(); err != nil {
			wrote <- err
			return
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true}); err != nil {
			wrote <- err
			return
		}
		chunk := make([]byte, 16<<10)
		for range 4 * wire.StreamWindow / len(chunk) {
			if err := fr.WriteData(1, false, chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	_, readErr = io.Copy(io.Discard, c)
	return readErr, <-wrote
}

// A connection that sends more than MaxPreAuthBytes before any of its
// streams is admitted is closed, all its streams with it: however long
// its tokens wait for review, and however many streams it opens after
// refused ones, it makes the server read at most MaxPreAuthBytes (each
// stream in review could otherwise hold a stream window, 1 MiB, and each
// refused stream be followed by another). An address that had a
// connection cut has its handshakes refused without a check for a while,
// and past refusedBurst (10) cuts its new connections are closed before
// their TLS handshake. A connection whose stream was admitted sends what
// it likes.
func TestConnectionsSendLittleBeforeTheyAuthenticate(t *testing.T) {
	reviews := newHeldReviews(t)
	reg := prometheus.NewRegistry()
	// The buckets refill only when clk steps: ten cuts take longer than
	// a second on a loaded machine.
	clk := clocktest.New(time.Now())
	e := startEnv(t, server.Config{Authenticator: reviews, Registerer: reg, Clock: clk})
	rejections := func(reason string) float64 {
		v, _ := metricstest.Value(reg, "servercount_server_agent_rejections_total", "reason", reason)
		return v
	}
	unauthenticated := func() float64 {
		v, _ := metricstest.Value(reg, "servercount_server_agent_connections_unauthenticated")
		return v
	}

	// A stream window's worth on one stream, whose token stays in
	// review: the server stops reading at MaxPreAuthBytes and closes the
	// connection (its GOAWAY or settings first, then EOF or a reset), and
	// the writes fail.
	readErr, writeErr := sendBeforeAuth(t, e, "127.0.0.1")
	var ne net.Error
	require.False(t, errors.As(readErr, &ne) && ne.Timeout(), "the server kept the connection open: %v", readErr)
	require.Error(t, writeErr, "4 MiB written to a connection that proved nothing")
	require.Equal(t, 1.0, rejections("too_many_bytes_before_auth"))
	require.Eventually(t, func() bool { return unauthenticated() == 0 }, waitFor, time.Millisecond)

	// Until its bucket is full again, the address's handshakes are
	// refused without a check: its next connections' streams never reach
	// a review. Nine more cuts spend its burst (they count apart from
	// refused tokens); the next connection is closed at once, before its
	// TLS handshake, and another address is not.
	calls := reviews.calls.Load()
	for range 9 {
		_, writeErr := sendBeforeAuth(t, e, "127.0.0.1")
		require.Error(t, writeErr)
	}
	require.Equal(t, calls, reviews.calls.Load(), "tokens checked from an address whose connections were cut")
	require.Equal(t, 10.0, rejections("too_many_bytes_before_auth"))
	// Each of the ten connections' streams is refused without a check,
	// or, the first one's only, went to review: a handler that runs
	// late (a loaded machine) comes after its connection was cut, and is
	// refused. Counted once every one has run.
	require.Eventually(t, func() bool {
		return rejections("too_many_cut_connections")+float64(reviews.calls.Load()) == 10
	}, waitFor, time.Millisecond, "handshakes refused without a check")
	refused := rejections("too_many_cut_connections")
	readErr, writeErr = sendBeforeAuth(t, e, "127.0.0.1")
	require.Error(t, readErr, "a TLS handshake with an address past its burst")
	require.Equal(t, readErr, writeErr, "the dial itself failed")
	require.Equal(t, refused+1, rejections("too_many_cut_connections"), "a connection closed at accept")
	require.Equal(t, 10.0, rejections("too_many_bytes_before_auth"), "a connection closed at accept is not read")
	_, writeErr = sendBeforeAuth(t, e, "127.0.0.2")
	require.Error(t, writeErr)
	require.Equal(t, 11.0, rejections("too_many_bytes_before_auth"), "another address is cut, not refused")
	// A second later the address has one connection again: its TLS
	// handshake is served, and it is cut for what it sends.
	clk.Step(time.Second)
	_, writeErr = sendBeforeAuth(t, e, "127.0.0.1")
	require.Error(t, writeErr)
	require.Equal(t, 12.0, rejections("too_many_bytes_before_auth"), "a connection a second later is read")

	// An admitted stream's connection is not bound: 4 MiB of DATA (for a
	// connection the server does not know, which it answers once). From
	// an address of its own: 127.0.0.1 is refused for a while.
	reviews.open()
	a, err := adversarytest.DialDeafAgent(t.Context(), adversarytest.AgentConfig{Conn: connFrom(t, e, "127.0.0.3"), ID: "good", Token: "good"})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	data := make([]byte, 32<<10)
	for range 4 * wire.StreamWindow / len(data) {
		require.NoError(t, a.Send(wire.Data(1, data)))
	}
	pkt, err := a.Recv()
	require.NoError(t, err, "the admitted stream was ended")
	require.Equal(t, client.PacketType_CLOSE_REQ, pkt.GetType())
	require.Equal(t, 12.0, rejections("too_many_bytes_before_auth"))
	require.Zero(t, unauthenticated())
}
