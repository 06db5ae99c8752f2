package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A proxy-server that gets SIGTERM lets an open tunnel
// finish, in both frontend modes. A streaming download (10 chunks, one
// every 300 ms) through a server told to stop after its first chunk
// receives every byte; a new frontend connection after the SIGTERM is
// refused; and the server exits once the tunnel has ended, well within
// its 20 s grace. (Before, the server cut the tunnel at once: 1 chunk of
// 10.)
func TestServerLetsOpenTunnelsFinishOnSIGTERM(t *testing.T) {
	const chunks, chunk = 10, 4 << 10
	serverBin, agentBin := proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")
	target := churn.StartStreamer(t, chunks, chunk, 300*time.Millisecond)
	for _, mode := range []string{"http-connect", "grpc"} {
		t.Run(mode, func(t *testing.T) {
			socket := filepath.Join(t.TempDir(), "proxy.sock")
			ports := nettest.FreePorts(t, 5)
			p := func(i int) string { return strconv.Itoa(ports[i]) }
			srv := proctest.Start(t, serverBin, "--insecure-plaintext", "--mode="+mode, "--uds-name="+socket,
				"--agent-port="+p(0), "--health-port="+p(1), "--admin-port="+p(2), "--health-bind-address=127.0.0.1",
				"--graceful-shutdown-timeout=20s")
			proctest.Start(t, agentBin, "--insecure-plaintext", "--proxy-server-host=127.0.0.1", "--proxy-server-port="+p(0),
				"--health-server-host=127.0.0.1", "--health-server-port="+p(3), "--admin-server-port="+p(4))
			proctest.RequireStatus(t, "http://127.0.0.1:"+p(1)+"/readyz", http.StatusOK,
				20*time.Second, "the agent never connected:\n%s", srv.Output())

			dial := churn.OverUnix(mode, socket)
			c := churn.OpenStream(t, dial, target, chunk)

			require.NoError(t, srv.Process.Signal(syscall.SIGTERM))
			// Once the server has stopped listening, a new frontend is
			// refused; the open tunnel goes on.
			require.Eventually(t, func() bool {
				nctx, ncancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer ncancel()
				nc, err := dial(nctx, target)
				if err == nil {
					nc.Close()
				}
				return err != nil
			}, 10*time.Second, 50*time.Millisecond, "a new frontend was still taken after SIGTERM")
			rest, err := io.ReadAll(c)
			require.NoError(t, err)
			assert.Equal(t, (chunks-1)*chunk, len(rest), "bytes after the SIGTERM")

			select {
			case <-srv.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("the server did not exit once its tunnel ended:\n%s", srv.Output())
			}
			assert.NoError(t, srv.Wait(t))
			assert.Contains(t, srv.Output(), "Every tunnel has ended")
		})
	}
}
