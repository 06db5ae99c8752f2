package server

import "fmt"

// maxLoggedPeerBytes is how much of a string a peer sent goes into a log
// line or an error: more than any real agent ID, address, identifier list
// or dial error, and small enough that a hostile peer cannot grow the log
// by more than about this much per line, whatever its headers or packets
// hold (gRPC admits headers up to GRPCMaxHeaderListSize, packets up to
// 16 MiB).
const maxLoggedPeerBytes = 512

// capPeer returns s, which a peer sent, cut to maxLoggedPeerBytes with its
// full length noted. It does not quote: klog quotes and escapes every
// string value it logs, and an error that carries the result formats it
// with %q, so that newlines and control bytes cannot forge log lines.
func capPeer(s string) string {
	if len(s) <= maxLoggedPeerBytes {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:maxLoggedPeerBytes], len(s))
}
