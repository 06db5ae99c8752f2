// Package wire holds what servercount's proxy-server and proxy-agent share
// of the Konnectivity wire protocol: the gRPC service descriptor of
// /AgentService/Connect, the handshake's metadata keys, and the agent
// identifiers. The packet types and /ProxyService/Proxy come from
// sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client.
//
// The package does no I/O of its own.
package wire

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Metadata keys of the /AgentService/Connect handshake. gRPC sends keys in
// lower case; the constants keep upstream's spelling for readers.
const (
	// HeaderAgentID carries the agent's ID, agent to server, exactly once.
	HeaderAgentID = "agentID"
	// HeaderAgentIdentifiers carries the agent's identifiers, URL-query
	// encoded (see [Identifiers]), agent to server, at most once.
	HeaderAgentIdentifiers = "agentIdentifiers"
	// HeaderAuthorization carries "Bearer <token>" when the server
	// authenticates agents by token.
	HeaderAuthorization = "authorization"
	// HeaderServerID carries the server's ID in the response headers.
	HeaderServerID = "serverID"
	// HeaderServerCount carries, in the response headers, the number of
	// proxy-servers an agent should connect to, as a decimal integer.
	HeaderServerCount = "serverCount"
	// HeaderTunnelWindow announces servercount's per-tunnel flow control
	// (see WindowUpdate): the sender's receive window per tunnel, in
	// bytes, as a decimal integer from 1 to MaxTunnelWindow. The agent
	// sends it with its handshake; a server that takes it up answers with
	// its own in the response headers, and only then is flow control on
	// for the stream. Upstream ignores the header, so either end speaks
	// the plain protocol with an upstream peer.
	HeaderTunnelWindow = "servercount-tunnel-window"
)

// Per-tunnel flow-control windows.
const (
	// DefaultTunnelWindow is the window each end offers by default: as
	// for gRPC's stream window (StreamWindow), large enough for one
	// tunnel to fill a loopback or LAN link, small enough that a
	// receiver can hold it for every tunnel of a stream.
	DefaultTunnelWindow = 1 << 20
	// MaxTunnelWindow is the largest HeaderTunnelWindow accepted.
	MaxTunnelWindow = 1 << 30
)

// CheckTunnelWindow checks a configured window: 1 to MaxTunnelWindow
// bytes, or -1 for no flow control. The error starts with n and says what
// is allowed, for the caller to prefix with the setting's name.
func CheckTunnelWindow(n int) error {
	if n == -1 || n >= 1 && n <= MaxTunnelWindow {
		return nil
	}
	return fmt.Errorf("%d: want 1 to %d bytes, or -1 for no flow control", n, MaxTunnelWindow)
}

// ParseTunnelWindow reads a HeaderTunnelWindow value; ok is false when
// there is not exactly one value or it is out of range, and then flow
// control stays off.
func ParseTunnelWindow(values []string) (window int, ok bool) {
	if len(values) != 1 {
		return 0, false
	}
	n, err := strconv.Atoi(values[0])
	if err != nil || n < 1 || n > MaxTunnelWindow {
		return 0, false
	}
	return n, true
}

// PacketWindow is the type of servercount's WINDOW packet, sent only on
// streams whose handshake turned flow control on: the receiver of a
// tunnel's DATA has written Data.Data's uvarint more bytes of
// Data.ConnectID and grants the sender that much more credit. Its number
// is far from upstream's types so that it cannot meet a future one.
const PacketWindow client.PacketType = 1000

// WindowUpdate returns WINDOW{connectID, n}.
func WindowUpdate(connectID int64, n int) *client.Packet {
	return &client.Packet{Type: PacketWindow, Payload: &client.Packet_Data{
		Data: &client.Data{ConnectID: connectID, Data: binary.AppendUvarint(nil, uint64(n))},
	}}
}

// ParseWindowUpdate returns the connectID and the credit of a WINDOW
// packet; ok is false for a malformed one, which is to be ignored.
func ParseWindowUpdate(pkt *client.Packet) (connectID int64, n int, ok bool) {
	d := pkt.GetData()
	v, k := binary.Uvarint(d.GetData())
	if k <= 0 || k != len(d.GetData()) || v == 0 || v > MaxTunnelWindow {
		return 0, 0, false
	}
	return d.GetConnectID(), int(v), true
}

// PacketTypeNone is the packet_type label of a failed receive, which has
// no packet: upstream's value.
const PacketTypeNone = "Unknown"

// PacketTypeUnknown is the packet_type label of every packet type
// PacketTypeName does not know.
const PacketTypeUnknown = "UNKNOWN"

// PacketTypeName names typ for metric labels: upstream's names, "WINDOW",
// "HEARTBEAT", or PacketTypeUnknown for any other number, so that a peer
// sending made-up types cannot make a series for each.
func PacketTypeName(typ client.PacketType) string {
	switch typ {
	case PacketWindow:
		return "WINDOW"
	case PacketHeartbeat:
		return "HEARTBEAT"
	}
	if _, known := client.PacketType_name[int32(typ)]; !known {
		return PacketTypeUnknown
	}
	return typ.String()
}

// AgentServiceName and ConnectMethod name the agent service. Upstream's
// proto file declares no package, so the names have no prefix.
const (
	AgentServiceName = "AgentService"
	ConnectMethod    = "/AgentService/Connect"
)

// AgentConnectServer is the server's side of a Connect stream.
type AgentConnectServer = grpc.BidiStreamingServer[client.Packet, client.Packet]

// AgentConnectClient is the agent's side of a Connect stream.
type AgentConnectClient = grpc.BidiStreamingClient[client.Packet, client.Packet]

// AgentServiceServer is implemented by a proxy-server to accept agents.
type AgentServiceServer interface {
	Connect(AgentConnectServer) error
}

// AgentServiceDesc describes /AgentService/Connect: one bidirectional
// stream of packets, the agent being the gRPC client.
var AgentServiceDesc = grpc.ServiceDesc{
	ServiceName: AgentServiceName,
	HandlerType: (*AgentServiceServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Connect",
		Handler:       connectHandler,
		ServerStreams: true,
		ClientStreams: true,
	}},
	Metadata: "agent.proto",
}

func connectHandler(srv any, stream grpc.ServerStream) error {
	return srv.(AgentServiceServer).Connect(&grpc.GenericServerStream[client.Packet, client.Packet]{ServerStream: stream})
}

// RegisterAgentServiceServer registers srv on s.
func RegisterAgentServiceServer(s grpc.ServiceRegistrar, srv AgentServiceServer) {
	s.RegisterService(&AgentServiceDesc, srv)
}

// Connect opens a Connect stream on cc.
func Connect(ctx context.Context, cc grpc.ClientConnInterface, opts ...grpc.CallOption) (AgentConnectClient, error) {
	stream, err := cc.NewStream(ctx, &AgentServiceDesc.Streams[0], ConnectMethod, opts...)
	if err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[client.Packet, client.Packet]{ClientStream: stream}, nil
}

// MaxDataPayload is the most data the agent and the server put in one DATA
// packet: the size of one read from a socket. Upstream reads 4 KiB, which
// costs throughput. It stays a little under 32 KiB so that the encoded
// packet (payload plus at most ~25 bytes of Packet and Data framing) fits
// gRPC's 32 KiB buffer-pool tier: one byte more and gRPC takes a buffer from
// its 1 MiB tier and zeroes all of it for every message.
const MaxDataPayload = 32<<10 - 64

// Transport settings both ends of a tunnel use.
const (
	// StreamWindow and ConnWindow are HTTP/2 flow-control windows large
	// enough for one stream to fill a loopback or LAN link: with gRPC's
	// 64 KiB default a tunnel upload runs at about half the speed.
	StreamWindow = 1 << 20
	ConnWindow   = 4 << 20
	// MaxMessageSize admits a DATA packet carrying one large write from a
	// konnectivity-client user, which sends each Write as one packet;
	// gRPC's default limit is 4 MiB. It is not lowered: upstream's
	// clients set no limit of their own, so a lower one would break a
	// client that writes more in one call. Such a packet costs one message
	// per stream while it is received; it is split (SplitData) before
	// it is queued, so queues never hold it whole.
	MaxMessageSize = 16 << 20
)

// Packet constructors, one per packet kind that the server and the agent
// send, so that each is built in one place.

// DialReq returns DIAL_REQ{protocol, address, random}: a frontend's ask
// for a tunnel, forwarded by the server to an agent.
func DialReq(protocol, address string, random int64) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_REQ, Payload: &client.Packet_DialRequest{
		DialRequest: &client.DialRequest{Protocol: protocol, Address: address, Random: random},
	}}
}

// DialRsp returns DIAL_RSP{random, connectID, errText}; errText empty
// means the dial succeeded.
func DialRsp(random, connectID int64, errText string) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_RSP, Payload: &client.Packet_DialResponse{
		DialResponse: &client.DialResponse{Random: random, ConnectID: connectID, Error: errText},
	}}
}

// DialCls returns DIAL_CLS{random}: the frontend gave up on a pending
// dial.
func DialCls(random int64) *client.Packet {
	return &client.Packet{Type: client.PacketType_DIAL_CLS, Payload: &client.Packet_CloseDial{
		CloseDial: &client.CloseDial{Random: random},
	}}
}

// CloseReq returns CLOSE_REQ{connectID}.
func CloseReq(connectID int64) *client.Packet {
	return &client.Packet{Type: client.PacketType_CLOSE_REQ, Payload: &client.Packet_CloseRequest{
		CloseRequest: &client.CloseRequest{ConnectID: connectID},
	}}
}

// CloseRsp returns CLOSE_RSP{connectID, errText}.
func CloseRsp(connectID int64, errText string) *client.Packet {
	return &client.Packet{Type: client.PacketType_CLOSE_RSP, Payload: &client.Packet_CloseResponse{
		CloseResponse: &client.CloseResponse{ConnectID: connectID, Error: errText},
	}}
}

// Data returns DATA{connectID, data}. The packet holds data, not a copy.
func Data(connectID int64, data []byte) *client.Packet {
	return &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{
		Data: &client.Data{ConnectID: connectID, Data: data},
	}}
}

// Drain returns DRAIN: the agent is going away; send it no new tunnels.
func Drain() *client.Packet {
	return &client.Packet{Type: client.PacketType_DRAIN, Payload: &client.Packet_Drain{Drain: &client.Drain{}}}
}

// SplitData calls fn with data cut into pieces of at most MaxDataPayload
// bytes, in order, until fn returns false. A peer may send one DATA packet
// of up to MaxMessageSize (konnectivity-client sends each Write whole);
// queueing it as it came would bound our queues in packets only, so a
// queue of n packets could hold n x 16 MiB. The bytes of a tunnel are a
// stream, so cutting them keeps their meaning. Pieces of an oversized
// packet are copies: a piece that aliased the received message would keep
// all of it alive for as long as any piece is queued. Data that fits is
// passed as it is, without a copy.
func SplitData(data []byte, fn func(piece []byte) bool) {
	if len(data) <= MaxDataPayload {
		if len(data) > 0 {
			fn(data)
		}
		return
	}
	for len(data) > 0 {
		n := min(len(data), MaxDataPayload)
		piece := make([]byte, n)
		copy(piece, data[:n])
		data = data[n:]
		if !fn(piece) {
			return
		}
	}
}
