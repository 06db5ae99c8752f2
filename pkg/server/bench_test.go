package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/servercount/servercount/pkg/server"
)

const benchSize = 10 << 20

// bulkServer serves one transfer per connection: after a 'd' it writes
// benchSize bytes and closes; after a 'u' it reads benchSize bytes and
// answers one byte.
func bulkServer(tb testing.TB) string {
	payload := make([]byte, benchSize)
	return serveConns(tb, func(c net.Conn) {
		var op [1]byte
		if _, err := io.ReadFull(c, op[:]); err != nil {
			return
		}
		switch op[0] {
		case 'd':
			_, _ = c.Write(payload)
		case 'u':
			if _, err := io.CopyN(io.Discard, c, benchSize); err == nil {
				_, _ = c.Write([]byte{1})
			}
		}
	})
}

// transfer runs one transfer of benchSize bytes on conn (reading through r).
func transfer(tb testing.TB, conn net.Conn, r io.Reader, op byte) {
	if _, err := conn.Write([]byte{op}); err != nil {
		tb.Fatal(err)
	}
	switch op {
	case 'd':
		if n, err := io.CopyN(io.Discard, r, benchSize); err != nil {
			tb.Fatalf("download: %d bytes: %v", n, err)
		}
	case 'u':
		// Write as a TLS client would, in pieces: one 10 MiB write through
		// the konnectivity client would be one 10 MiB gRPC message, over
		// gRPC's default 4 MiB limit.
		chunk := make([]byte, 32<<10)
		for range benchSize / len(chunk) {
			if _, err := conn.Write(chunk); err != nil {
				tb.Fatal(err)
			}
		}
		var ack [1]byte
		if _, err := io.ReadFull(r, ack[:]); err != nil {
			tb.Fatal(err)
		}
	}
}

// directTime is the best of a few direct loopback transfers: the
// baseline of BenchmarkTransfer's ratio.
func directTime(b *testing.B, target string, op byte) time.Duration {
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		c, err := net.Dial("tcp", target)
		if err != nil {
			b.Fatal(err)
		}
		transfer(b, c, c, op)
		c.Close()
		best = min(best, time.Since(start))
	}
	return best
}

// BenchmarkTransfer moves 10 MiB through the server and the test agent
// (gRPC over TLS between them), by HTTP CONNECT and by the
// konnectivity-client gRPC frontend, in each direction ("download":
// target to client). Each result reports x-direct, its throughput as a
// fraction of the same transfer over direct loopback TCP measured in the
// same run; the target is >= 0.15.
func BenchmarkTransfer(b *testing.B) {
	target := bulkServer(b)
	b.Run("tunnels", func(b *testing.B) {
		e, _ := startEnvAndAgent(b, server.Config{})
		for _, op := range []byte{'d', 'u'} {
			dir := map[byte]string{'d': "download", 'u': "upload"}[op]
			direct := directTime(b, target, op)
			report := func(b *testing.B) {
				perOp := b.Elapsed() / time.Duration(b.N)
				b.ReportMetric(float64(direct)/float64(perOp), "x-direct")
			}
			b.Run("http-connect/"+dir, func(b *testing.B) {
				b.SetBytes(benchSize)
				for b.Loop() {
					c, err := net.Dial("tcp", e.connectAddr)
					if err != nil {
						b.Fatal(err)
					}
					fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
					br := bufio.NewReaderSize(c, 64<<10)
					resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
					if err != nil || resp.StatusCode != http.StatusOK {
						b.Fatalf("CONNECT: %v %v", resp, err)
					}
					transfer(b, c, br, op)
					c.Close()
				}
				report(b)
			})
			b.Run("grpc/"+dir, func(b *testing.B) {
				b.SetBytes(benchSize)
				for b.Loop() {
					tun, err := kclient.CreateSingleUseGrpcTunnel(context.Background(), e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
					if err != nil {
						b.Fatal(err)
					}
					c, err := tun.DialContext(context.Background(), "tcp", target)
					if err != nil {
						b.Fatal(err)
					}
					transfer(b, c, c, op)
					c.Close()
					select {
					case <-tun.Done():
					case <-time.After(waitFor):
						b.Fatal("tunnel did not end")
					}
				}
				report(b)
			})
		}
	})
}
