package adversarytest

import (
	"encoding/binary"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// MaxDecodedPackets bounds the packets DecodePackets returns, so that a
// fuzz input costs a bounded time whatever its length.
const MaxDecodedPackets = 256

// EncodePackets returns pkts as bytes that [DecodePackets] turns back into
// the same packets: each packet's protobuf encoding, preceded by its
// length as a uvarint. Seed corpora of the packet fuzz targets are
// written this way.
func EncodePackets(pkts ...*client.Packet) []byte {
	var out []byte
	for _, p := range pkts {
		b, err := proto.Marshal(p)
		if err != nil {
			// A Packet built in Go always marshals; a fixture that
			// does not is a bug in the test.
			panic("adversary: EncodePackets: " + err.Error())
		}
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

// DecodePackets reads the packets EncodePackets wrote, or any bytes: a
// record whose bytes do not unmarshal as a Packet is skipped, and a length
// that runs past the end takes the rest. It stops after
// [MaxDecodedPackets]. Whatever the input, every packet returned is one a
// peer could send, since a peer's packets arrive as such records.
func DecodePackets(data []byte) []*client.Packet {
	var pkts []*client.Packet
	for len(data) > 0 && len(pkts) < MaxDecodedPackets {
		n, w := binary.Uvarint(data)
		if w <= 0 {
			return pkts
		}
		data = data[w:]
		rec := data[:min(uint64(len(data)), n)]
		data = data[len(rec):]
		p := &client.Packet{}
		if proto.Unmarshal(rec, p) == nil {
			pkts = append(pkts, p)
		}
	}
	return pkts
}
