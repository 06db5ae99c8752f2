package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/adversary"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/server"
)

// slowFrontendTimeout is the FrontendWriteTimeout of these tests: long
// enough that a frontend that reads is never taken for a deaf one on a
// loaded machine, short enough for a test.
const slowFrontendTimeout = 2 * time.Second

// endlessWriter starts a TCP server that writes to every connection until
// the write fails, and sends on ended when it has given up on one: the
// tunnel to it was closed.
func endlessWriter(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	done := make(chan struct{}, 16)
	addr = serveConns(t, func(c net.Conn) {
		chunk := make([]byte, 32<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				done <- struct{}{}
				return
			}
		}
	})
	return addr, done
}

// echoOnce writes a line through c and reads it back.
func echoOnce(c net.Conn, r io.Reader, n int) error {
	msg := []byte(fmt.Sprintf("ping %d\n", n))
	if err := c.SetDeadline(time.Now().Add(waitFor)); err != nil {
		return err
	}
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// gaugeOf reads a gauge from reg, 0 when the series does not exist (a
// labelled series exists only once it has been used). It never fails the
// test, so that it may run in require.Eventually's goroutine.
func gaugeOf(reg *prometheus.Registry, name string, labels map[string]string) func() float64 {
	var kv []string
	for k, v := range labels {
		kv = append(kv, k, v)
	}
	return func() float64 {
		v, _ := metricstest.Value(reg, name, kv...)
		return v
	}
}

// deafFrontend opens a tunnel to addr from a frontend that never reads,
// and returns a check that the server ended that frontend (nil when it
// did, as it should).
type deafFrontend func(ctx context.Context, t *testing.T, e *env, addr string) (ended func() error)

var deafFrontends = []struct {
	name string
	open deafFrontend
}{
	{"grpc", func(ctx context.Context, t *testing.T, e *env, addr string) func() error {
		deaf, err := adversary.DialDeafFrontend(ctx, adversary.FrontendConfig{Addr: e.frontAddr, TLS: e.frontTLS})
		require.NoError(t, err)
		t.Cleanup(deaf.Close)
		_, err = deaf.Dial(addr, 1)
		require.NoError(t, err)
		return func() error {
			if deaf.WaitEnded() == nil {
				return errors.New("the deaf frontend's stream ended without an error status")
			}
			return nil
		}
	}},
	{"http-connect", func(ctx context.Context, t *testing.T, e *env, addr string) func() error {
		deaf, err := adversary.DialDeafHTTPClient(ctx, adversary.HTTPClientConfig{Addr: e.connectAddr}, addr)
		require.NoError(t, err)
		t.Cleanup(func() { deaf.Close() })
		return func() error { _, err := deaf.WaitClosed(ctx); return err }
	}},
}

// A frontend that opens a tunnel and never reads costs only its own
// tunnel, with an agent that does not offer flow control, as upstream's
// (issue 10, item 7; with flow control see internal/proxytest's
// TestFlowControlDeafFrontendCostsOnlyItsTunnel): another tunnel on the
// same agent stream keeps flowing, waiting at most FrontendWriteTimeout;
// the deaf frontend is then ended at the server and its connection closed
// at the agent, and the agent stream stays.
func TestFrontendThatNeverReadsIsEnded(t *testing.T) {
	for _, mode := range deafFrontends {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewPedanticRegistry()
			e, a := startEnvAndAgent(t, server.Config{Registerer: reg, FrontendWriteTimeout: slowFrontendTimeout})
			established := gaugeOf(reg, "konnectivity_network_proxy_server_established_connections", nil)
			frontends := gaugeOf(reg, "konnectivity_network_proxy_server_grpc_connections", map[string]string{"service_method": "Proxy"})

			// The well-behaved tunnel, through the same agent stream.
			echo, br, code := connectVia(t, e, http.MethodConnect, echoServer(t))
			require.Equal(t, http.StatusOK, code)
			require.NoError(t, echoOnce(echo, br, 0))

			// The deaf frontend's tunnel goes to a target that writes
			// without end.
			bulk, bulkEnded := endlessWriter(t)
			ctx, cancel := context.WithTimeout(t.Context(), 3*waitFor)
			defer cancel()
			ended := mode.open(ctx, t, e, bulk)
			require.Equal(t, 2.0, established())

			// The other tunnel flows while the deaf one is full (it may
			// wait for at most the timeout, never for the deaf frontend
			// to read).
			for i := 1; i <= 3; i++ {
				require.NoError(t, echoOnce(echo, br, i), "round trip %d beside the deaf frontend", i)
			}

			// The deaf frontend is ended, its connection closed at the
			// agent.
			select {
			case <-bulkEnded:
			case <-time.After(waitFor + slowFrontendTimeout):
				t.Fatal("the deaf frontend's connection at the agent was never closed")
			}
			require.Eventually(t, func() bool { return frontends() == 0 && established() == 1 }, waitFor, 5*time.Millisecond,
				"the deaf frontend was not ended (frontend streams %v, established %v)", frontends(), established())
			require.NoError(t, ended())

			// The agent stream and the other tunnel are still there.
			require.NoError(t, echoOnce(echo, br, 4))
			assert.Equal(t, 1, e.srv.Backends())
			select {
			case <-a.done:
				t.Fatal("the agent stream ended")
			default:
			}
		})
	}
}
