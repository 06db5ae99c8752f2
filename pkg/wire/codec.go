package wire

import (
	"encoding/binary"
	"io"
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protobuf "google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// Codec is gRPC's protobuf codec with a faster way in for DATA packets:
// their data is read from gRPC's receive buffers straight into a buffer
// that [Recycle] takes back once it has been written, where the protobuf
// codec copies a message that came in several HTTP/2 frames (a full DATA
// packet does) twice, into one contiguous buffer and then into a new
// slice, and leaves the slice to the garbage collector.
// At tunnel speeds that garbage was a third of a proxy-server's CPU:
// allocating, zeroing, collecting and handing pages back to the kernel.
//
// Only a DATA packet in the form that protobuf encoders write (type, then
// Data with connectID and data, no error, nothing else) takes the fast
// way; every other message, and any packet it does not recognise, is left
// to the protobuf codec, so both decode the same bytes to the same packet
// (FuzzCodec). Marshalling is the protobuf codec's.
//
// Install it with grpc.ForceServerCodecV2 or grpc.ForceCodecV2. It has
// no state of its own: every Codec shares one pool of buffers. A gRPC
// stats handler that kept a packet past its HandleRPC call would see the
// data change once it is recycled.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name is the protobuf codec's name: the content-subtype on the wire does
// not change.
func (Codec) Name() string { return proto.Name }

// Marshal encodes v with the protobuf codec.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(proto.Name).Marshal(v)
}

// Unmarshal decodes data into v, a DATA packet's data of 4 KiB or more
// into a recycled buffer.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if pkt, ok := v.(*client.Packet); ok && unmarshalData(data, pkt) {
		return nil
	}
	return encoding.GetCodecV2(proto.Name).Unmarshal(data, v)
}

// recycledCap is the capacity of the buffers Unmarshal reads data into.
// It is one byte more than MaxDataPayload, a size no other slice in the
// proxy is made with (append rounds capacities to the allocator's size
// classes, which this is not), so that Recycle knows its own buffers. A
// prefix of one keeps its capacity: code that passes on part of a DATA
// packet's data must cut it with a full slice expression (b[:n:n]) or
// copy it, or a writer would recycle the whole buffer under the rest.
const recycledCap = MaxDataPayload + 1

// minRecycled is the least data read into a recycled buffer. Smaller
// data gets a slice of its own size: queues copy small pieces together
// (flow.Queue), so a 32 KiB buffer would carry a few bytes once and then
// be garbage.
const minRecycled = 4 << 10

// dataBuffers holds buffers of recycledCap bytes as array pointers, which
// a slice converts to and from without allocating. A package variable, as
// grpc's mem.DefaultBufferPool is: buffers are interchangeable, and a
// buffer decoded by one stream is often written out by another.
var dataBuffers = sync.Pool{New: func() any { return new([recycledCap]byte) }}

// DataBuffer returns a buffer of MaxDataPayload bytes from the pool that
// Codec decodes DATA into, for a reader that reads into it only while
// data flows; give it back with Recycle once nothing refers to it.
func DataBuffer() []byte { return dataBuffers.Get().(*[recycledCap]byte)[:MaxDataPayload] }

// Recycle gives b back for reuse if Codec or DataBuffer made it: the
// caller must be its only user and must not touch it afterwards. Any
// other slice is left to the garbage collector. A DATA packet's data is whole from Unmarshal to
// the writer that sends it on (queues hand on whole slices or copies,
// and a piece cut for flow control has its capacity cut too), so the
// writer that last sends it is where it is recycled.
func Recycle(b []byte) {
	if cap(b) != recycledCap {
		return
	}
	dataBuffers.Put((*[recycledCap]byte)(b[:recycledCap]))
}

// Field tags (field number << 3 | wire type) of a plain DATA packet.
const (
	tagPacketType  = 1<<3 | uint64(protowire.VarintType) // Packet.type
	tagPacketData  = 4<<3 | uint64(protowire.BytesType)  // Packet.data
	tagDataConnect = 1<<3 | uint64(protowire.VarintType) // Data.connectID
	tagDataData    = 3<<3 | uint64(protowire.BytesType)  // Data.data
)

// unmarshalData decodes data into pkt if it is a plain DATA packet of at
// most MaxDataPayload bytes of data, and reports whether it did.
func unmarshalData(data mem.BufferSlice, pkt *client.Packet) bool {
	if data.Len() > MaxDataPayload+64 || !startsAsData(data) {
		return false
	}
	r := data.Reader()
	defer r.Close()
	id, payload, ok := readData(r)
	if !ok {
		return false
	}
	protobuf.Reset(pkt)
	pkt.Type = client.PacketType_DATA
	pkt.Payload = &client.Packet_Data{Data: &client.Data{ConnectID: id, Data: payload}}
	return true
}

// startsAsData reports whether data begins with the bytes of type DATA,
// so that other packets (WINDOW, CLOSE_REQ...) go to protobuf at once.
func startsAsData(data mem.BufferSlice) bool {
	if len(data) == 0 {
		return false
	}
	b := data[0].ReadOnlyData()
	return len(b) >= 2 && uint64(b[0]) == tagPacketType && b[1] == byte(client.PacketType_DATA)
}

// readData reads a plain DATA packet from r: the type, then the Data
// message as the packet's last bytes, in which an optional connectID
// comes before optional data, which ends it. ok is false for anything
// else.
func readData(r *mem.Reader) (connectID int64, payload []byte, ok bool) {
	if tag, err := binary.ReadUvarint(r); err != nil || tag != tagPacketType {
		return 0, nil, false
	}
	if typ, err := binary.ReadUvarint(r); err != nil || typ != uint64(client.PacketType_DATA) {
		return 0, nil, false
	}
	if tag, err := binary.ReadUvarint(r); err != nil || tag != tagPacketData {
		return 0, nil, false
	}
	if n, err := binary.ReadUvarint(r); err != nil || n != uint64(r.Remaining()) {
		return 0, nil, false
	}
	if r.Remaining() == 0 {
		return 0, nil, true
	}
	tag, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, false
	}
	if tag == tagDataConnect {
		v, err := binary.ReadUvarint(r)
		if err != nil {
			return 0, nil, false
		}
		connectID = int64(v) // int64 fields are two's complement varints
		if r.Remaining() == 0 {
			return connectID, nil, true
		}
		if tag, err = binary.ReadUvarint(r); err != nil {
			return 0, nil, false
		}
	}
	if tag != tagDataData {
		return 0, nil, false
	}
	n, err := binary.ReadUvarint(r)
	if err != nil || n != uint64(r.Remaining()) || n > MaxDataPayload {
		return 0, nil, false
	}
	if n == 0 {
		return connectID, nil, true // as protobuf decodes empty bytes
	}
	if n < minRecycled {
		payload = make([]byte, n)
	} else {
		payload = dataBuffers.Get().(*[recycledCap]byte)[:n]
	}
	if _, err := io.ReadFull(r, payload); err != nil {
		Recycle(payload)
		return 0, nil, false
	}
	return connectID, payload, true
}
