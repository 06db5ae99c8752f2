package server_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/pkg/server"
)

// rawConnect sends a CONNECT request with the given request target and
// Host header to the HTTP CONNECT frontend and returns the status.
func rawConnect(t *testing.T, e *env, target, host string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.connectAddr, waitFor)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// Issue 10, item 10: a CONNECT target the agent cannot dial is answered
// 400 by the server, and no DIAL_REQ reaches the agent.
func TestHTTPConnectRefusesInvalidTargets(t *testing.T) {
	t.Parallel()
	e := startEnv(t, server.Config{})
	a := startAgent(t, e, agentOpts{id: "a1"})
	waitBackends(t, e, 1)
	tests := []struct {
		name, target, host string
	}{
		{name: "empty", target: "", host: ""},
		{name: "slash", target: "/", host: "/"},
		{name: "host without port", target: "127.0.0.1", host: "127.0.0.1"},
		{name: "port without host", target: ":80", host: ":80"},
		{name: "port zero", target: "127.0.0.1:0", host: "127.0.0.1:0"},
		{name: "port too large", target: "127.0.0.1:65536", host: "127.0.0.1:65536"},
		{name: "named port", target: "127.0.0.1:http", host: "127.0.0.1:http"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, http.StatusBadRequest, rawConnect(t, e, tc.target, tc.host))
		})
	}
	assert.Zero(t, a.dials.Load(), "dial requests that reached the agent")
}
