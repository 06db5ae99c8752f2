package nettest

// Pattern returns n bytes of an endless stream, starting at offset off, in
// which a byte lost, repeated or out of order shows: compare what went
// through a tunnel with Pattern(0, total).
func Pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) % 251)
	}
	return b
}
