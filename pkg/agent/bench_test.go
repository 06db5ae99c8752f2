package agent

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// benchSize is the bytes moved per benchmark iteration.
const benchSize = 10 << 20

// BenchmarkTunnelThroughput moves 10 MiB per iteration through one agent
// tunnel, in each direction, next to the same transfer over a direct
// loopback TCP connection (the baseline: compare MB/s). Only the agent is
// in the path; the proxy-server is the test harness.
func BenchmarkTunnelThroughput(b *testing.B) {
	chunk := make([]byte, wire.MaxDataPayload)

	b.Run("direct", func(b *testing.B) {
		sink, got := newSink(b)
		conn, err := net.Dial("tcp", sink)
		require.NoError(b, err)
		b.Cleanup(func() { _ = conn.Close() })
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			for off := 0; off < benchSize; off += len(chunk) {
				_, err := conn.Write(chunk)
				require.NoError(b, err)
			}
			<-got
		}
	})

	b.Run("to-endpoint", func(b *testing.B) {
		_, st := oneStream(b)
		sink, got := newSink(b)
		id := st.DialOK(b, sink, 1)
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			for off := 0; off < benchSize; off += len(chunk) {
				st.Send(b, wire.Data(id, chunk))
			}
			<-got
		}
	})

	b.Run("from-endpoint", func(b *testing.B) {
		_, st := oneStream(b)
		src := newTestTarget(b, false)
		id := st.DialOK(b, src.addr, 1)
		conn := src.accepted(b)
		b.SetBytes(benchSize)
		b.ReportAllocs()
		for b.Loop() {
			go func() {
				for off := 0; off < benchSize; off += len(chunk) {
					if _, err := conn.Write(chunk); err != nil {
						return
					}
				}
			}()
			for n := 0; n < benchSize; {
				d := st.NextOf(b, pb.PacketType_DATA).GetData()
				if d.GetConnectID() != id {
					b.Fatalf("DATA for connectID %d, want %d", d.GetConnectID(), id)
				}
				n += len(d.GetData())
			}
		}
	})
}

// newSink listens for one connection and reads it, signalling on got
// after every benchSize bytes.
func newSink(b *testing.B) (addr string, got <-chan struct{}) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	var conn net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			close(accepted)
			return
		}
		conn = c
		close(accepted)
		buf := make([]byte, wire.MaxDataPayload)
		total := 0
		for {
			n, err := c.Read(buf)
			total += n
			for total >= benchSize {
				total -= benchSize
				ch <- struct{}{}
			}
			if err != nil {
				return
			}
		}
	}()
	b.Cleanup(func() {
		_ = lis.Close()
		<-accepted
		if conn != nil {
			_ = conn.Close()
		}
		<-done
	})
	return lis.Addr().String(), ch
}
