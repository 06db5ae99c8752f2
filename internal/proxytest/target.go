package proxytest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// Echo is a target's connection handler (see nettest.StartTarget) that
// writes back what it reads until EOF.
func Echo(c net.Conn) { _, _ = io.Copy(c, c) }

// Bulk is a target's connection handler for throughput measurements. It
// reads requests of one command byte and an 8-byte big-endian length n:
//
//   - 'U' (upload): it reads n bytes, then writes one byte 'k';
//   - 'D' (download): it writes n bytes.
//
// It serves requests until EOF or an unknown command.
func Bulk(c net.Conn) {
	buf := make([]byte, 32<<10)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int64(binary.BigEndian.Uint64(hdr[1:]))
		switch hdr[0] {
		case 'U':
			if err := discard(c, n, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{'k'}); err != nil {
				return
			}
		case 'D':
			for n > 0 {
				m := min(n, int64(len(buf)))
				if _, err := c.Write(buf[:m]); err != nil {
					return
				}
				n -= m
			}
		default:
			return
		}
	}
}

// Upload sends len(data) bytes to a [Bulk] target over c in chunks of at
// most chunk bytes, and waits for the target to confirm it read them all.
func Upload(c net.Conn, data []byte, chunk int) error {
	var hdr [9]byte
	hdr[0] = 'U'
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(data)))
	if _, err := c.Write(hdr[:]); err != nil {
		return fmt.Errorf("send upload request: %w", err)
	}
	for len(data) > 0 {
		m := min(len(data), chunk)
		if _, err := c.Write(data[:m]); err != nil {
			return fmt.Errorf("upload: %w", err)
		}
		data = data[m:]
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("read upload confirmation: %w", err)
	}
	if ack[0] != 'k' {
		return fmt.Errorf("upload confirmation is %q, want 'k'", ack[0])
	}
	return nil
}

// Download asks a [Bulk] target over c for n bytes and reads them into
// buf-sized pieces.
func Download(c net.Conn, n int64, buf []byte) error {
	var hdr [9]byte
	hdr[0] = 'D'
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return fmt.Errorf("send download request: %w", err)
	}
	if err := discard(c, n, buf); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	return nil
}

// discard reads exactly n bytes from r into buf, over and over. (io.Copy to
// io.Discard would read 8 KiB at a time whatever buffer it is given.)
func discard(r io.Reader, n int64, buf []byte) error {
	for n > 0 {
		m, err := r.Read(buf[:min(n, int64(len(buf)))])
		n -= int64(m)
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				return fmt.Errorf("%d bytes short: %w", n, io.ErrUnexpectedEOF)
			}
			if n > 0 {
				return err
			}
		}
	}
	return nil
}
