package server

import (
	"io"
	"net"
	"time"

	"github.com/servercount/servercount/pkg/wire"
)

// An HTTP CONNECT tunnel's writer: the goroutine that writes the agent's
// bytes to the client, started by whoever delivers them (httpTunnel.deliver)
// and gone while there are none.

// kick starts a writer unless one runs, the 200 has not gone out yet, or
// the connection is over. Whoever puts on data or closes closed calls it
// after (serveTunnel, once it has set client, too). Its callers are goroutines
// that Server.Close waits for (receive loops, pumps, serveTunnel), so that
// adding to lifecycle.wg never races with its Wait.
func (ht *httpTunnel) kick() {
	ht.wmu.Lock()
	conn := ht.client
	ht.wmu.Unlock()
	if conn == nil {
		return
	}
	ht.writer.Kick(func() {
		ht.fs.life.wg.Add(1)
		go ht.writeLoop(conn)
	})
}

// writeLoop writes the agent's bytes to the client until there are none
// left. Once closed is closed (CLOSE_RSP) it writes what is queued and
// ends the connection. Each slice is the whole data of a packet or a
// copy, and this is its last user: written, it is recycled.
func (ht *httpTunnel) writeLoop(conn net.Conn) {
	defer ht.fs.life.wg.Done()
	for {
		var d []byte
		var got, closing bool
		if !ht.writer.Next(func() bool {
			// closed before data: what was delivered before CLOSE_RSP
			// closed it is in data by then, so that data found empty
			// after it means everything was written. Looked at the other
			// way round, DATA and CLOSE_RSP could both come between the
			// two looks, and the connection end with that DATA unwritten.
			closing = isClosed(ht.closed)
			select {
			case d = <-ht.data:
				got = true
				return true
			default:
			}
			return closing || isClosed(ht.fs.life.quit)
		}) {
			return // idle: the next kick starts another
		}
		switch {
		case got:
			_, err := conn.Write(d)
			ht.queued.add(-len(d))
			wire.Recycle(d)
			if err != nil {
				ht.shutdown()
				ht.end(conn)
				return
			}
		case closing:
			lingerClose(conn)
			ht.end(conn)
			return
		default: // the Server closes
			ht.end(conn)
			return
		}
	}
}

// end closes the client connection for good: no writer starts after.
func (ht *httpTunnel) end(conn net.Conn) {
	_ = conn.Close()
	ht.writer.End()
	close(ht.flushed)
}

// lingerTimeout bounds lingerClose's wait for the client's end.
const lingerTimeout = time.Second

// lingerClose ends the tunnel toward the client without losing what was
// written: it sends the end of the stream (FIN, or TLS close_notify and
// FIN) and reads until the client closes too, for at most lingerTimeout,
// before the caller closes conn. Closing at once with the client's bytes
// unread (it was still sending) would send a TCP reset, and a reset makes
// the client's kernel drop what it had not yet read of the target's last
// bytes.
func lingerClose(conn net.Conn) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	if conn.SetReadDeadline(time.Now().Add(lingerTimeout)) != nil {
		return
	}
	_, _ = io.Copy(io.Discard, conn) // until EOF, the deadline, or an error: all end it
}
