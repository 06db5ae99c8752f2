package proxytest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/nettest"
)

// benchChunk is the size of each write of the benchmark clients, and of
// their read buffers.
const benchChunk = 32 << 10

// startBenchFixture starts a server and an agent as in production: TLS on
// the agent link, mTLS on both frontends.
func startBenchFixture(b *testing.B) *Server {
	b.Helper()
	env := NewEnv(b, "bench-ca")
	srv := StartServer(b, env, ServerOptions{})
	StartAgent(b, env, FastAgentConfig("agent-1", srv.AgentAddr()))
	require.Eventually(b, srv.Core().Ready, waitFor, tick, "agent never connected")
	return srv
}

// BenchmarkThroughput moves 10 MiB per iteration through the server and
// the agent, and the same 10 MiB over a direct loopback TCP connection, in
// the same iteration, and reports both rates and their ratio (x-direct).
// Each connection is opened once, before the timed loop.
func BenchmarkThroughput(b *testing.B) {
	const size = 10 << 20
	srv := startBenchFixture(b)
	target := nettest.StartTarget(b, Bulk)
	data := make([]byte, size)
	_, _ = rand.Read(data)

	directions := []struct {
		name string
		xfer func(c net.Conn, buf []byte) error
	}{
		{name: "upload", xfer: func(c net.Conn, _ []byte) error { return Upload(c, data, benchChunk) }},
		{name: "download", xfer: func(c net.Conn, buf []byte) error { return Download(c, size, buf) }},
	}
	for _, m := range frontendModes {
		for _, dir := range directions {
			b.Run("mode="+m.name+"/dir="+dir.name, func(b *testing.B) {
				ctx, cancel := context.WithTimeout(b.Context(), waitFor)
				defer cancel()
				direct, err := DirectDial(ctx, target.Addr())
				require.NoError(b, err)
				defer direct.Close()
				tunnel, err := m.dial(srv)(ctx, target.Addr())
				require.NoError(b, err)
				defer tunnel.Close()
				buf := make([]byte, benchChunk)
				// Warm up both paths (TCP windows, gRPC flow control).
				require.NoError(b, dir.xfer(direct, buf))
				require.NoError(b, dir.xfer(tunnel, buf))

				var dDirect, dTunnel time.Duration
				n := 0
				for b.Loop() {
					start := time.Now()
					if err := dir.xfer(direct, buf); err != nil {
						b.Fatalf("direct: %v", err)
					}
					mid := time.Now()
					if err := dir.xfer(tunnel, buf); err != nil {
						b.Fatalf("tunnel: %v", err)
					}
					dDirect += mid.Sub(start)
					dTunnel += time.Since(mid)
					n++
				}
				mbps := func(d time.Duration) float64 { return float64(size) * float64(n) / d.Seconds() / 1e6 }
				b.ReportMetric(mbps(dTunnel), "MB/s")
				b.ReportMetric(mbps(dDirect), "direct-MB/s")
				b.ReportMetric(dDirect.Seconds()/dTunnel.Seconds(), "x-direct")
			})
		}
	}
}

// BenchmarkDial opens a connection to a loopback listener through the
// server and the agent, next to a direct TCP connect to the same listener
// in the same iteration, and reports both times and their ratio
// (x-direct). A gRPC dial makes a new single-use tunnel (gRPC connection,
// mTLS handshake, Proxy stream, DIAL_REQ, DIAL_RSP), as kube-apiserver
// does for each request; an HTTP CONNECT dial makes a new mTLS connection,
// sends CONNECT and reads the 200. Closing is not timed.
//
// For reference, each iteration also times a bare mTLS handshake with the
// HTTP CONNECT port (mtls-ns/dial): the share of a tunnel dial that is the
// TLS handshake alone (both of its ends run in this process).
func BenchmarkDial(b *testing.B) {
	srv := startBenchFixture(b)
	// The target keeps each connection until the client closes it.
	target := nettest.StartTarget(b, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	for _, m := range frontendModes {
		b.Run("mode="+m.name, func(b *testing.B) {
			dial := m.dial(srv)
			ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
			defer cancel()
			tlsDialer := tls.Dialer{Config: srv.frontendTLS}
			var dDirect, dTunnel, dTLS time.Duration
			n := 0
			for b.Loop() {
				start := time.Now()
				tc, err := tlsDialer.DialContext(ctx, "tcp", srv.HTTPConnectAddr())
				if err != nil {
					b.Fatalf("mTLS handshake: %v", err)
				}
				dTLS += time.Since(start)
				tc.Close()

				start = time.Now()
				direct, err := DirectDial(ctx, target.Addr())
				if err != nil {
					b.Fatalf("direct: %v", err)
				}
				dDirect += time.Since(start)
				start = time.Now()
				tunnel, err := dial(ctx, target.Addr())
				if err != nil {
					b.Fatalf("tunnel: %v", err)
				}
				dTunnel += time.Since(start)
				direct.Close()
				tunnel.Close()
				n++
			}
			b.ReportMetric(float64(dTunnel.Nanoseconds())/float64(n), "ns/dial")
			b.ReportMetric(float64(dDirect.Nanoseconds())/float64(n), "direct-ns/dial")
			b.ReportMetric(float64(dTLS.Nanoseconds())/float64(n), "mtls-ns/dial")
			b.ReportMetric(dTunnel.Seconds()/dDirect.Seconds(), "x-direct")
		})
	}
}
