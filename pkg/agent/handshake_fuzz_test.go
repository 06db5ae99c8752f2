package agent

import (
	"strconv"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/servercount/servercount/pkg/wire"
)

// FuzzParseHandshake feeds the agent whatever serverID and serverCount
// headers a server could send, one or two of each. It must not panic, and
// accept only one non-empty serverID and one decimal count >= 0.
func FuzzParseHandshake(f *testing.F) {
	f.Add("s1", "3", false)
	f.Add("", "1", false)
	f.Add("s1", "-1", false)
	f.Add("s1", "1e9", false)
	f.Add("s1", "99999999999999999999", false)
	f.Add("s1", " 3", false)
	f.Add("s1", "3", true)
	f.Fuzz(func(t *testing.T, id, count string, twice bool) {
		md := metadata.Pairs(wire.HeaderServerID, id, wire.HeaderServerCount, count)
		if twice {
			md.Append(wire.HeaderServerCount, count)
		}
		gotID, gotCount, err := parseHandshake(md)
		if err != nil {
			return
		}
		n, perr := strconv.Atoi(count)
		switch {
		case twice:
			t.Fatalf("two serverCount headers accepted: %q", count)
		case id == "" || gotID != id:
			t.Fatalf("serverID %q accepted as %q", id, gotID)
		case perr != nil || n < 0 || gotCount != n:
			t.Fatalf("serverCount %q accepted as %d", count, gotCount)
		}
	})
}
