package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// TestAnswerToARepeatedRequestIsSent holds the control loop inside the
// send of a CLOSE_RSP, as when the server has it and asks again before
// the send returns: the answer to the second request, with its own error,
// is queued and sent after the first, not dropped as the same answer.
// When the key of the first stayed until its send returned, the second
// was dropped: TestTunnelEndpointCloses, whose server asks to close a
// closed tunnel, failed so once in a CI run.
func TestAnswerToARepeatedRequestIsSent(t *testing.T) {
	a, st := oneStream(t)
	c := onlyClient(t, a)
	c.sendMu.Lock() // holds every send of the stream
	held := true
	release := func() {
		if held {
			held = false
			c.sendMu.Unlock()
		}
	}
	t.Cleanup(release)
	c.sendControl(wire.CloseRsp(5, ""), 5)
	waitSending(t, c)
	c.sendControl(wire.CloseRsp(5, "second"), 5)
	release()

	first := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
	assert.Equal(t, int64(5), first.GetConnectID())
	assert.Empty(t, first.GetError())
	second := st.NextOf(t, pb.PacketType_CLOSE_RSP).GetCloseResponse()
	assert.Equal(t, int64(5), second.GetConnectID())
	assert.Equal(t, "second", second.GetError())
}

// onlyClient returns the stream of an agent that holds one server.
func onlyClient(t *testing.T, a *testAgent) *client {
	t.Helper()
	var c *client
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, cl := range a.clients {
			c = cl
		}
		return c != nil
	}, waitFor, time.Millisecond, "the agent never held the server")
	return c
}

// waitSending waits until c's control loop is inside the send of an
// answer it has taken, with none left in its queue.
func waitSending(t *testing.T, c *client) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.controlMu.Lock()
		defer c.controlMu.Unlock()
		return len(c.control) == 0 && c.sending == 1
	}, waitFor, time.Millisecond, "the control loop never took the first answer")
}
