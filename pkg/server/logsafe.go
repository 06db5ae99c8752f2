package server

import (
	"fmt"
	"strconv"
)

// maxLoggedPeerBytes is how much of a string a peer sent goes into a log
// line or an error: enough for any real agent ID, address or identifier
// list, small enough that a hostile peer cannot grow the log by more than
// about this much per connection.
const maxLoggedPeerBytes = 256

// capQuote returns s, which a peer sent, ready to be logged: quoted (so
// that newlines and control bytes cannot forge log lines) and, when
// longer than maxLoggedPeerBytes, cut there with the full length noted.
func capQuote(s string) string {
	if len(s) <= maxLoggedPeerBytes {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:maxLoggedPeerBytes]), len(s))
}
