package nettest

import "io"

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

// WriteUntilFailed writes to w as fast as it takes data, until a write
// fails (the connection is closed, at either end), and returns that
// error: a peer that never stops talking.
func WriteUntilFailed(w io.Writer) error {
	chunk := make([]byte, 32<<10)
	for {
		if _, err := w.Write(chunk); err != nil {
			return err
		}
	}
}
