package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/server"
)

// A dial the frontend could never match an answer to (random 0, or no
// dial request at all) is refused at once instead of hanging.
func TestMalformedDialRequestIsRefused(t *testing.T) {
	e, _ := startEnvAndAgent(t, server.Config{})
	echo := echoServer(t)
	cc, err := grpc.NewClient(e.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(e.frontTLS)))
	require.NoError(t, err)
	defer cc.Close()
	for _, pkt := range []*client.Packet{
		{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{DialRequest: &client.DialRequest{Protocol: "tcp", Address: echo, Random: 0}}},
		{Type: client.PacketType_DIAL_REQ},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		stream, err := client.NewProxyServiceClient(cc).Proxy(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(pkt))
		got, err := stream.Recv()
		require.NoError(t, err, "no answer to a malformed dial")
		assert.Equal(t, client.PacketType_DIAL_RSP, got.GetType())
		assert.Contains(t, got.GetDialResponse().GetError(), "invalid dial request")
		cancel()
	}
}
