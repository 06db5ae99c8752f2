package wire_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// pieces returns b as a BufferSlice of buffers of at most size bytes, as
// gRPC hands over a message that came in several HTTP/2 frames.
func pieces(b []byte, size int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(size, len(b))
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}

// codecMatchesProtobuf checks that Codec decodes enc, cut into buffers of
// size bytes, exactly as protobuf does: the same error or lack of one, and
// the same packet.
func codecMatchesProtobuf(t *testing.T, enc []byte, size int) {
	t.Helper()
	var want client.Packet
	wantErr := proto.Unmarshal(enc, &want)
	var got client.Packet
	gotErr := wire.Codec{}.Unmarshal(pieces(enc, size), &got)
	if wantErr != nil {
		require.Error(t, gotErr, "protobuf refuses %x: %v", enc, wantErr)
		return
	}
	require.NoError(t, gotErr, "protobuf decodes %x", enc)
	require.True(t, proto.Equal(&want, &got), "%x: protobuf %v, Codec %v", enc, &want, &got)
	wire.Recycle(got.GetData().GetData())
}

func marshal(t testing.TB, pkt *client.Packet) []byte {
	t.Helper()
	b, err := proto.Marshal(pkt)
	require.NoError(t, err)
	return b
}

// codecCases are packets and byte strings at the edges of the fast way: a
// plain DATA packet in its forms, and near misses it must leave to
// protobuf.
func codecCases(t testing.TB) [][]byte {
	full := bytes.Repeat([]byte{0xa5}, wire.MaxDataPayload)
	return [][]byte{
		marshal(t, wire.Data(7, []byte("hello"))),
		marshal(t, wire.Data(-1, []byte("negative connectID"))), // a 10-byte varint
		marshal(t, wire.Data(0, []byte("no connectID"))),
		marshal(t, wire.Data(9, nil)),
		marshal(t, wire.Data(0, nil)),
		marshal(t, wire.Data(1<<40, full)),
		marshal(t, wire.Data(3, append(full, 1))), // one byte over: protobuf's
		marshal(t, &client.Packet{Type: client.PacketType_DATA, Payload: &client.Packet_Data{Data: &client.Data{ConnectID: 4, Error: "an error", Data: []byte("x")}}}),
		marshal(t, wire.WindowUpdate(5, 1<<20)),
		marshal(t, wire.CloseReq(6)),
		marshal(t, wire.DialReq("tcp", "10.0.0.1:443", 99)),
		marshal(t, &client.Packet{Type: client.PacketType_DATA}),
		{0x08, 0x04, 0x22, 0x00},                                   // DATA with an empty Data
		{0x08, 0x04, 0x22, 0x04, 0x1a, 0x02, 'h', 'i'},             // data without connectID
		{0x08, 0x04, 0x22, 0x06, 0x1a, 0x02, 'h', 'i', 0x08, 0x01}, // connectID after data
		{0x08, 0x04, 0x22, 0x02, 0x1a, 0x05},                       // data longer than the message
		{0x08, 0x04, 0x22, 0x09, 0x08, 0x01},                       // Data longer than the packet
		{0x08, 0x04, 0x22, 0x04, 0x1a, 0x02, 'h', 'i', 0x30, 0x01}, // a field after Data
		{0x08, 0x84, 0x80, 0x80, 0x80, 0x10, 0x22, 0x00},           // type 4 in an over-long varint
		{0x08, 0x04, 0x22, 0x04, 0x08, 0x80, 0x80, 0x80},           // truncated connectID
		{0x08, 0x04, 0x22, 0x04, 0x1a, 0x02, 'h', 'i', 0x22, 0x00}, // a second Data
		{0x08, 0x04},
		{0x08},
		{},
	}
}

// Codec decodes every case as protobuf does, whole and cut into buffers
// of every size from 1 byte, the way gRPC hands over a message received in
// several frames.
func TestCodecMatchesProtobuf(t *testing.T) {
	for _, enc := range codecCases(t) {
		for _, size := range []int{1, 2, 3, 5, 16 << 10, len(enc) + 1} {
			codecMatchesProtobuf(t, enc, size)
		}
	}
}

// The data of a plain DATA packet of 4 KiB or more is a recycled buffer,
// which stays the caller's until it is given back; nothing else is taken
// back.
func TestCodecRecyclesDataBuffers(t *testing.T) {
	decode := func(data []byte) []byte {
		var pkt client.Packet
		require.NoError(t, wire.Codec{}.Unmarshal(pieces(marshal(t, wire.Data(1, data)), 1000), &pkt))
		require.Equal(t, data, pkt.GetData().GetData())
		return pkt.GetData().GetData()
	}
	want := bytes.Repeat([]byte("first"), 1000)
	first := decode(want)
	assert.Greater(t, cap(first), wire.MaxDataPayload, "not a recycled buffer")
	small := decode([]byte("small"))
	assert.Equal(t, len("small"), cap(small), "small data is not worth a recycled buffer")

	// Slices the codec did not make are ignored, whatever their size.
	wire.Recycle(make([]byte, wire.MaxDataPayload))
	wire.Recycle(nil)

	// The buffer survives until recycled: decoding more does not touch it.
	other := decode(bytes.Repeat([]byte("other"), 1000))
	assert.Equal(t, want, first)
	wire.Recycle(other)
	wire.Recycle(first)
}

// Messages other than packets go to the protobuf codec both ways.
func TestCodecOtherMessages(t *testing.T) {
	c := wire.Codec{}
	assert.Equal(t, encoding.GetCodecV2(grpcproto.Name).Name(), c.Name())
	enc, err := c.Marshal(&client.DialRequest{Address: "a:1"})
	require.NoError(t, err)
	var got client.DialRequest
	require.NoError(t, c.Unmarshal(enc, &got))
	assert.Equal(t, "a:1", got.GetAddress())
	assert.Error(t, c.Unmarshal(enc, "not a message"))
}

// Codec and protobuf decode any bytes alike, cut into any buffer size.
func FuzzCodec(f *testing.F) {
	for _, enc := range codecCases(f) {
		f.Add(enc, uint16(7))
	}
	f.Fuzz(func(t *testing.T, enc []byte, size uint16) {
		codecMatchesProtobuf(t, enc, int(size)%(len(enc)+1)+1)
	})
}

// BenchmarkUnmarshalData decodes a full DATA packet, received in two
// HTTP/2 frames, with Codec and with gRPC's protobuf codec, in the same
// run; Codec's data is recycled as a writer would once it was written.
func BenchmarkUnmarshalData(b *testing.B) {
	enc := marshal(b, wire.Data(42, bytes.Repeat([]byte{1}, wire.MaxDataPayload)))
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"protobuf", encoding.GetCodecV2(grpcproto.Name)}, {"codec", wire.Codec{}}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				var pkt client.Packet
				if err := c.codec.Unmarshal(pieces(enc, 16<<10), &pkt); err != nil {
					b.Fatal(err)
				}
				wire.Recycle(pkt.GetData().GetData())
			}
		})
	}
}
