package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/servercount/servercount/internal/fuzztest"
)

// FuzzHTTPConnectRequest writes whatever request bytes the fuzzer makes to
// a real HTTP CONNECT port of a server with no agent. Nothing may panic,
// every request gets an answer or a closed connection within a deadline,
// and no request is told 200: there is no agent to reach anything.
func FuzzHTTPConnectRequest(f *testing.F) {
	fuzztest.AddBytes(f,
		"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n",
		"CONNECT / HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT :80 HTTP/1.1\r\n\r\n",
		"CONNECT host-without-port HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT [::1]:99999 HTTP/1.1\r\n\r\n",
		"\x00\x01garbage\r\n\r\n",
	)
	s, err := New(Config{ServerID: "s1"})
	if err != nil {
		f.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(s.HTTPConnect())
	hs.Config.ReadHeaderTimeout = time.Second
	hs.Start()
	f.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		s.Close()
	})
	addr := hs.Listener.Addr().String()
	f.Fuzz(func(t *testing.T, req []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(req); err != nil {
			return // the server may close on a bad request before it is all read
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("no answer and no close within 10s to %q", req)
			}
			return // closed, or not HTTP: nothing was tunnelled
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("%q was answered 200 with no agent", req)
		}
	})
}
