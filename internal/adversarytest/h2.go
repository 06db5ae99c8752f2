package adversarytest

import (
	"bytes"
	"strings"

	"golang.org/x/net/http2/hpack"

	"github.com/servercount/servercount/pkg/wire"
)

// ConnectHeaders returns the HPACK block of the HEADERS frame that opens
// an agent's Connect stream with agentID and a bearer token, for a test
// that speaks HTTP/2 itself (golang.org/x/net/http2's Framer) to send
// what no gRPC client would: data before the handshake is answered, more
// streams than the server allows, a flood that never reads.
func ConnectHeaders(agentID, token string) []byte {
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":path", Value: wire.ConnectMethod}, {Name: ":authority", Value: "localhost"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: strings.ToLower(wire.HeaderAgentID), Value: agentID},
	}
	if token != "" {
		fields = append(fields, hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, hf := range fields {
		_ = enc.WriteField(hf) // writes to a bytes.Buffer: no error
	}
	return block.Bytes()
}
