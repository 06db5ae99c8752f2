package proxytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/wire"
)

// wire.Codec reads DATA into buffers that writers recycle once they have
// sent them on. With windows that cut every 32 KiB packet into pieces
// (5000 bytes: no divisor of the packet size), a writer that recycled a
// piece's buffer while the rest of it waited for credit would hand that
// memory to the next packet decoded, and an echo would come back changed.
// Several tunnels at once in both directions keep the buffers moving.
// Without flow control (-1) packets are forwarded as they came, through
// the other paths to the writers.
func TestRecycledBuffersKeepEveryByte(t *testing.T) {
	const (
		tunnels = 4
		size    = 1 << 20
	)
	for _, window := range []int{5000, -1} {
		for _, m := range frontendModes {
			t.Run(fmt.Sprintf("%s/window=%d", m.name, window), func(t *testing.T) {
				recycleRoundTrips(t, m, window, tunnels, size)
			})
		}
	}
}

// recycleRoundTrips echoes size random bytes through each of tunnels
// tunnels at once, with window as both ends' tunnel window.
func recycleRoundTrips(t *testing.T, m frontendMode, window, tunnels, size int) {
	f := startFixture(t, ServerOptions{TunnelWindow: window}, func(cfg *agent.Config) { cfg.TunnelWindow = window })
	echo := echoTarget(t)
	var wg sync.WaitGroup
	for i := range tunnels {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
			defer cancel()
			c, err := m.dial(f.srv)(ctx, echo.Addr())
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			context.AfterFunc(ctx, func() { c.Close() })
			data := make([]byte, size)
			_, _ = rand.Read(data)
			go func() {
				// One Write per full packet: the gRPC frontend sends
				// each as one DATA packet.
				for b := data; len(b) > 0; b = b[min(len(b), wire.MaxDataPayload):] {
					if _, err := c.Write(b[:min(len(b), wire.MaxDataPayload)]); err != nil {
						return // shows as a short read
					}
				}
			}()
			got := make([]byte, size)
			_, err = io.ReadFull(c, got)
			if assert.NoError(t, err, "tunnel %d: read the echo", i) {
				assert.True(t, bytes.Equal(data, got), "tunnel %d: the echo differs from what was sent, first at byte %s", i, firstDifference(data, got))
			}
		})
	}
	wg.Wait()
}

// firstDifference names the first index where a and b differ.
func firstDifference(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprint(i)
		}
	}
	return "the end"
}
