package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/adversarytest"
	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

// In a FuzzAgentPackets input, randoms 1 and 2 stand for the dials the
// target makes before the input's packets are sent: 1 for an HTTP CONNECT
// client's, 2 for a gRPC frontend's.
const (
	fuzzHTTPRandom = 1
	fuzzGRPCRandom = 2
	// fuzzHost is the fuzzed agent's host identifier: the destHost
	// strategy sends it the dials for fuzzHost.
	fuzzHost = "fuzz.invalid"
)

// FuzzAgentPackets sends a real server whatever packets an authenticated
// agent could send, while an HTTP CONNECT client and a gRPC frontend each
// wait on a dial through that agent (randoms 1 and 2 in the input stand
// for their dials). The server must not panic; once the agent and the two
// frontends are gone, no tunnel, pending dial or stream may be left; and a
// well-behaved tunnel through another agent must work. The fuzzed agent
// offers flow control, so that WINDOW packets and DATA past the window are
// fuzzed too. One server serves every input.
func FuzzAgentPackets(f *testing.F) {
	for _, seed := range [][]*client.Packet{
		{wire.DialRsp(fuzzHTTPRandom, 5, ""), wire.Data(5, []byte("HTTP/1.1 200 OK\r\n\r\n")), wire.CloseRsp(5, "")},
		{wire.DialRsp(fuzzGRPCRandom, 6, ""), wire.Data(6, []byte("hello")), wire.Data(6, bytes.Repeat([]byte("x"), 3*wire.MaxDataPayload))},
		{wire.DialRsp(fuzzHTTPRandom, 0, "refused"), wire.DialRsp(fuzzGRPCRandom, 0, "")},
		{wire.DialRsp(fuzzHTTPRandom, 7, ""), wire.DialRsp(fuzzGRPCRandom, 7, ""), wire.DialRsp(fuzzGRPCRandom, 8, "")},
		{wire.Drain(), wire.DialRsp(fuzzGRPCRandom, 9, ""), wire.CloseReq(9), wire.CloseRsp(9, "gone"), wire.Data(9, []byte("late"))},
		{wire.DialReq("tcp", "127.0.0.1:1", 3), wire.DialCls(fuzzHTTPRandom), wire.CloseReq(0)},
		{{Type: client.PacketType_DATA}, {Type: client.PacketType_DIAL_RSP}, {Type: client.PacketType(99)}},
		{{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_DialResponse{DialResponse: &client.DialResponse{Random: fuzzGRPCRandom, ConnectID: 3}}}},
		{wire.DialRsp(fuzzGRPCRandom, 4, ""), wire.WindowUpdate(4, 1<<20), wire.WindowUpdate(4, wire.MaxTunnelWindow), wire.WindowUpdate(77, 1), {Type: wire.PacketWindow}},
		{wire.DialRsp(fuzzHTTPRandom, 3, ""), wire.Data(3, bytes.Repeat([]byte("o"), 3*wire.MaxDataPayload)), wire.Data(3, []byte("past the window"))},
	} {
		f.Add(adversarytest.EncodePackets(seed...))
	}

	reg := prometheus.NewPedanticRegistry()
	e := startEnv(f, server.Config{Registerer: reg, Strategies: []server.Strategy{server.StrategyDestHost, server.StrategyDefault},
		TunnelWindow: 2 * wire.MaxDataPayload})
	startAgent(f, e, agentOpts{id: "well-behaved"})
	waitBackends(f, e, 1)
	echo := echoServer(f)
	// One connection to each port serves every input's streams.
	agentCC, err := grpc.NewClient(e.agentAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.agentTLS)),
		grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow))
	require.NoError(f, err)
	f.Cleanup(func() { agentCC.Close() })
	frontCC, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(f, err)
	f.Cleanup(func() { frontCC.Close() })
	// A labelled series that does not exist yet is 0: on a loaded machine
	// an input can end before the gRPC frontend's stream reaches the
	// server, and then no ProxyService/Proxy stream was ever counted.
	gauge := func(name string, labels ...string) float64 {
		v, _ := metricstest.Value(reg, name, labels...)
		return v
	}
	var grpcRandom int64 = 1 << 40

	f.Fuzz(func(t *testing.T, data []byte) {
		pkts := adversarytest.DecodePackets(data)
		ctx, cancel := context.WithTimeout(t.Context(), waitFor)
		defer cancel()
		a, err := adversarytest.DialDeafAgent(ctx, adversarytest.AgentConfig{Conn: agentCC, ID: "fuzzed", Identifiers: "host=" + fuzzHost,
			Metadata: []string{wire.HeaderTunnelWindow, strconv.Itoa(wire.DefaultTunnelWindow)}})
		require.NoError(t, err)
		defer a.Close()
		waitBackends(t, e, 2)

		// Two frontends wait on dials through the fuzzed agent; each
		// reads what it gets until it is closed.
		var d net.Dialer
		hc, err := d.DialContext(ctx, "tcp", e.connectAddr)
		require.NoError(t, err)
		defer hc.Close()
		_, err = fmt.Fprintf(hc, "CONNECT %s:80 HTTP/1.1\r\nHost: %s:80\r\n\r\n", fuzzHost, fuzzHost)
		require.NoError(t, err)
		httpRead := make(chan struct{})
		go func() { defer close(httpRead); _, _ = io.Copy(io.Discard, hc) }()
		fe, err := adversarytest.DialDeafFrontend(ctx, adversarytest.FrontendConfig{Conn: frontCC})
		require.NoError(t, err)
		defer fe.Close()
		grpcRandom++
		require.NoError(t, fe.Send(wire.DialReq("tcp", fuzzHost+":80", grpcRandom)))
		grpcRead := make(chan struct{})
		go func() { defer close(grpcRead); _ = fe.WaitEnded() }()

		randoms := map[int64]int64{fuzzGRPCRandom: grpcRandom}
		for len(randoms) < 2 {
			p, err := a.Recv()
			require.NoError(t, err, "waiting for the two DIAL_REQs")
			if r := p.GetDialRequest().GetRandom(); p.GetType() == client.PacketType_DIAL_REQ && r != grpcRandom {
				randoms[fuzzHTTPRandom] = r
			}
		}
		// From here on the agent hears everything, so that the server
		// never waits on it: the packets it sends are what is fuzzed.
		heard := make(chan struct{})
		go func() {
			defer close(heard)
			for {
				if _, err := a.Recv(); err != nil {
					return
				}
			}
		}()
		for _, p := range pkts {
			fuzzSubstitute(p, randoms)
			if a.Send(p) != nil {
				break // the server ended the stream
			}
		}

		// Everyone leaves: nothing may be left behind.
		hc.Close()
		fe.Close()
		a.Close()
		<-heard
		<-httpRead
		<-grpcRead
		waitBackends(t, e, 1)
		require.Eventually(t, func() bool {
			return gauge("konnectivity_network_proxy_server_established_connections") == 0 &&
				gauge("konnectivity_network_proxy_server_pending_backend_dials") == 0 &&
				gauge("konnectivity_network_proxy_server_http_connections") == 0 &&
				gauge("konnectivity_network_proxy_server_grpc_connections", "service_method", "Proxy") == 0 &&
				gauge("servercount_server_queued_bytes") == 0
		}, waitFor, time.Millisecond, "tunnels, dials, frontends or queued bytes left behind")

		// The server still serves a well-behaved tunnel.
		c, br, code := connectVia(t, e, "CONNECT", echo)
		require.Equal(t, 200, code)
		require.NoError(t, echoOnce(c, br, len(pkts)))
		require.NoError(t, c.Close())
	})
}

// fuzzSubstitute turns the placeholder randoms of p into the dials'.
func fuzzSubstitute(p *client.Packet, randoms map[int64]int64) {
	if r := p.GetDialResponse(); r != nil {
		if real, ok := randoms[r.Random]; ok {
			r.Random = real
		}
	}
	if c := p.GetCloseDial(); c != nil {
		if real, ok := randoms[c.Random]; ok {
			c.Random = real
		}
	}
}
