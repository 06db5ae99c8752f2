package wire_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer answers the handshake and echoes packets back.
type echoServer struct{}

func (echoServer) Connect(stream wire.AgentConnectServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if err := stream.SendHeader(metadata.Pairs(wire.HeaderServerID, "s-"+md.Get(wire.HeaderAgentID)[0], wire.HeaderServerCount, "3")); err != nil {
		return err
	}
	for {
		p, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(p); err != nil {
			return err
		}
	}
}

func TestConnectOverRealGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	wire.RegisterAgentServiceServer(s, echoServer{})
	go s.Serve(lis) //nolint:errcheck // Stop ends it
	defer s.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(t.Context(), wire.HeaderAgentID, "a1")
	stream, err := wire.Connect(ctx, cc)
	require.NoError(t, err)
	hdr, err := stream.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{"s-a1"}, hdr.Get(wire.HeaderServerID))
	assert.Equal(t, []string{"3"}, hdr.Get(wire.HeaderServerCount))

	sent := &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 7, Data: []byte("hi")}}}
	require.NoError(t, stream.Send(sent))
	got, err := stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(7), got.GetData().GetConnectID())
	assert.Equal(t, []byte("hi"), got.GetData().GetData())
	require.NoError(t, stream.CloseSend())
}
