package server_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// closeOrderAgent is an agent that dials nothing: it takes every dial,
// counts each tunnel's DATA, and records what a tunnel got by the time
// its CLOSE_REQ came, and any DATA after it (an agent drops that, as
// upstream's does: the bytes are lost).
type closeOrderAgent struct {
	mu     sync.Mutex
	got    map[int64]int    // DATA bytes per connectID; guarded by mu
	closed map[int64]int    // bytes got when CLOSE_REQ came; guarded by mu
	late   map[int64]int    // DATA bytes after CLOSE_REQ; guarded by mu
	head   map[int64][]byte // the first 8 bytes of each connection; guarded by mu
	want   map[int64]int    // the size each tunnel's header announced; guarded by mu
	// closedAt is when each CLOSE_REQ came; guarded by mu.
	closedAt map[int64]time.Time

	a      *adversarytest.DeafAgent
	sendMu sync.Mutex // serialises Sends on a: a stream's Send is not safe for concurrent use
}

// send sends pkt to the server.
func (r *closeOrderAgent) send(pkt *pb.Packet) {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	_ = r.a.Send(pkt)
}

func serveCloseOrder(t *testing.T, a *adversarytest.DeafAgent) *closeOrderAgent {
	r := &closeOrderAgent{got: map[int64]int{}, closed: map[int64]int{}, late: map[int64]int{}, head: map[int64][]byte{}, want: map[int64]int{}, closedAt: map[int64]time.Time{}, a: a}
	done := make(chan struct{})
	t.Cleanup(func() { a.Close(); <-done })
	go func() {
		defer close(done)
		var next int64
		for {
			pkt, err := a.Recv()
			if err != nil {
				return
			}
			switch pkt.GetType() {
			case pb.PacketType_DIAL_REQ:
				next++
				r.send(wire.DialRsp(pkt.GetDialRequest().GetRandom(), next, ""))
			case pb.PacketType_DATA:
				r.data(pkt.GetData().GetConnectID(), pkt.GetData().GetData())
			case pb.PacketType_CLOSE_REQ:
				id := pkt.GetCloseRequest().GetConnectID()
				r.mu.Lock()
				if _, dup := r.closed[id]; !dup {
					r.closed[id] = r.got[id]
					r.closedAt[id] = time.Now()
				}
				r.mu.Unlock()
				r.send(wire.CloseRsp(id, ""))
			}
		}
	}()
	return r
}

// data counts b, DATA of connection id; the first 8 bytes of a
// connection are its header: how many bytes follow it.
func (r *closeOrderAgent) data(id int64, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := r.head[id]; len(h) < 8 {
		h = append(h, b[:min(len(b), 8-len(h))]...)
		r.head[id] = h
		if len(h) == 8 {
			r.want[id] = 8 + int(binary.BigEndian.Uint64(h))
		}
	}
	if _, over := r.closed[id]; over {
		r.late[id] += len(b)
		return
	}
	r.got[id] += len(b)
}

// closedCount is how many tunnels got CLOSE_REQ.
func (r *closeOrderAgent) closedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.closed)
}

// closeOrderSizes are the bytes each frontend writes after its header:
// around nothing, one packet and a few, cycled over the tunnels.
var closeOrderSizes = []int{0, 1, 32<<10 - 1, 32 << 10, 32<<10 + 1, 100 << 10, 256 << 10}

// A tunnel's CLOSE_REQ never overtakes its own DATA, whatever the other
// tunnels of the agent stream do: many tunnels send bulk data to one
// agent at once, so that the server's writer to it is loaded and senders
// wait for room in its queue, and each frontend closes right after its
// last byte. The agent must have every byte of a tunnel when its
// CLOSE_REQ comes, and none after (an agent drops DATA for a tunnel it
// closed: upstream's does so without a word). Until 2026-12-07 a
// CLOSE_REQ could go one packet early: its place in the queue was taken
// from a count of queued packets that senders made after their put, so a
// packet of another tunnel put but not yet counted let it pass this
// tunnel's last DATA.
func TestCloseNeverOvertakesItsData(t *testing.T) {
	const tunnels = 96
	for _, mode := range []string{"http-connect", "grpc"} {
		t.Run(mode, func(t *testing.T) {
			rec, dial, _ := startCloseOrder(t, mode)
			var wg sync.WaitGroup
			for i := range tunnels {
				size := closeOrderSizes[i%len(closeOrderSizes)]
				wg.Go(func() {
					c, err := dial(t.Context())
					if !assert.NoError(t, err, "dial %d", i) {
						return
					}
					hdr := binary.BigEndian.AppendUint64(nil, uint64(size))
					_, err = c.Write(append(hdr, nettest.Pattern(0, size)...))
					assert.NoError(t, err, "write %d", i)
					assert.NoError(t, c.Close())
				})
			}
			wg.Wait()
			require.Eventually(t, func() bool { return rec.closedCount() == tunnels }, waitFor, 5*time.Millisecond, "every tunnel gets CLOSE_REQ")

			rec.mu.Lock()
			defer rec.mu.Unlock()
			short := 0
			for id, got := range rec.closed {
				if got != rec.want[id] || rec.late[id] > 0 {
					short++
					t.Errorf("tunnel %d: %d of %d bytes before its CLOSE_REQ, %d after", id, got, rec.want[id], rec.late[id])
				}
			}
			require.Zero(t, short, "tunnels whose CLOSE_REQ overtook their DATA, of %d", tunnels)
		})
	}
}

// A frontend's CLOSE_REQ reaches an agent without flow control
// (upstream's protocol) no sooner than PlainAgentCloseDelay after the
// frontend closed, behind every byte of the tunnel, even when the
// agent's endpoint sends meanwhile: upstream's agent drops what it has
// not yet written to its endpoint when CLOSE_REQ comes (make integrity
// shows what the delay saves).
func TestPlainAgentGetsCloseLater(t *testing.T) {
	const size = 40 << 10
	for _, mode := range []string{"http-connect", "grpc"} {
		t.Run(mode, func(t *testing.T) {
			rec, dial, reg := startCloseOrder(t, mode)
			c, err := dial(t.Context())
			require.NoError(t, err)
			hdr := binary.BigEndian.AppendUint64(nil, size)
			_, err = c.Write(append(hdr, nettest.Pattern(0, size)...))
			require.NoError(t, err)
			closed := time.Now()
			require.NoError(t, c.Close())
			if mode == "http-connect" {
				// The server forgets the tunnel at once; DATA from its
				// endpoint meanwhile must not bring the CLOSE_REQ
				// forward.
				established := gaugeOf(reg, "konnectivity_network_proxy_server_established_connections", nil)
				require.Eventually(t, func() bool { return established() == 0 }, waitFor, time.Millisecond)
				rec.send(wire.Data(1, []byte("late")))
			}
			require.Eventually(t, func() bool { return rec.closedCount() == 1 }, waitFor, 5*time.Millisecond, "the tunnel gets CLOSE_REQ")

			rec.mu.Lock()
			defer rec.mu.Unlock()
			for id, at := range rec.closedAt {
				assert.GreaterOrEqual(t, at.Sub(closed), server.PlainAgentCloseDelay, "CLOSE_REQ after the frontend closed")
				assert.Equal(t, 8+size, rec.closed[id], "bytes before CLOSE_REQ")
				assert.Zero(t, rec.late[id], "bytes after CLOSE_REQ")
			}
		})
	}
}

// startCloseOrder starts a server with one closeOrderAgent, an agent of
// upstream's protocol (no flow control), and returns it and how to open a
// tunnel to it in mode.
func startCloseOrder(t *testing.T, mode string) (*closeOrderAgent, func(context.Context) (net.Conn, error), *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	e := startEnv(t, server.Config{Registerer: reg})
	da, err := connectAgent(t, e, agentOpts{id: "a1"})
	require.NoError(t, err)
	waitBackends(t, e, 1)
	return serveCloseOrder(t, da), closeOrderDialer(t, e, mode), reg
}

// closeOrderDialer returns how the test opens a tunnel to the agent
// through e in mode: an HTTP CONNECT connection, or a dial on one shared
// gRPC connection (konnectivity-client's reusable tunnel: one Proxy
// stream per dial, all on one HTTP/2 connection).
func closeOrderDialer(t *testing.T, e *env, mode string) func(context.Context) (net.Conn, error) {
	const target = "127.0.0.1:9" // the agent dials nothing
	if mode == "grpc" {
		tun, err := client.CreateGRPCTunnel(t.Context(), e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = tun.Close() })
		return func(ctx context.Context) (net.Conn, error) { return tun.DialContext(ctx, "tcp", target) }
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", e.connectAddr)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err == nil && res.StatusCode != http.StatusOK {
			err = fmt.Errorf("CONNECT: %s", res.Status)
		}
		if err == nil && br.Buffered() > 0 {
			err = io.ErrUnexpectedEOF // the agent sends nothing
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// A frontend's close of a tunnel while its agent (without flow control)
// streams DATA on it: the DATA that comes between the tunnel's end and its
// delayed CLOSE_REQ is dropped, never answered with an early CLOSE_REQ,
// which would cut the delay short and lose the frontend's last bytes at
// upstream's agent. Each round closes one HTTP CONNECT tunnel while the
// agent floods it, so that the agent's DATA is handled in every step of
// the close (and the race detector sees the two loops cross).
func TestPlainAgentStreamingAsFrontendClosesGetsCloseLater(t *testing.T) {
	const rounds = 40
	rec, dial, _ := startCloseOrder(t, "http-connect")
	closedAt := map[int64]time.Time{}
	for id := int64(1); id <= rounds; id++ {
		c, err := dial(t.Context())
		require.NoError(t, err)
		stop, flooded := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(flooded)
			for {
				select {
				case <-stop:
					return
				default:
					rec.send(wire.Data(id, []byte("flood")))
				}
			}
		}()
		// The flood is on its way before the client closes.
		require.Eventually(t, func() bool {
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			n, _ := c.Read(make([]byte, 64))
			return n > 0
		}, waitFor, time.Millisecond)
		closedAt[id] = time.Now()
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool { return rec.closedCount() == int(id) }, waitFor, time.Millisecond, "tunnel %d gets CLOSE_REQ", id)
		close(stop)
		<-flooded
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, at := range rec.closedAt {
		assert.GreaterOrEqual(t, at.Sub(closedAt[id]), server.PlainAgentCloseDelay, "tunnel %d: CLOSE_REQ after the frontend closed", id)
	}
}
