package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/ondemand"
	"github.com/servercount/servercount/pkg/wire"
)

// httpTunnel is one HTTP CONNECT connection: a frontend with exactly one
// tunnel.
type httpTunnel struct {
	fs     *frontends
	dialed chan *client.DialResponse // the DIAL_RSP; buffer of 1, written once
	data   chan []byte               // DATA from the agent, read by writeLoop
	closed chan struct{}             // closed by shutdown: CLOSE_RSP, or too slow
	once   sync.Once
	// queued counts the bytes in data and the chunk being written.
	queued queuedBytes
	// conn is the hijacked connection; nil before the hijack. Guarded by
	// Server.mu (frontends.mu).
	conn net.Conn

	// writer runs writeLoop while there is something to write (see
	// kick), from when client is set, once the 200 has gone out, until a
	// writer has ended the connection; flushed is closed then. wmu
	// guards client.
	writer  ondemand.Loop
	wmu     sync.Mutex
	client  net.Conn
	flushed chan struct{}
}

// HTTPConnect returns the HTTP CONNECT frontend: for each CONNECT request
// it dials the request's host:port through an agent and then relays bytes
// both ways. Other methods get 405.
func (s *Server) HTTPConnect() http.Handler {
	return http.HandlerFunc(s.frontends.serveConnect)
}

// serveConnect serves one HTTP CONNECT request: it dials through an agent
// and hands the connection to serveTunnel.
func (fs *frontends) serveConnect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.Header().Set("Allow", http.MethodConnect)
		http.Error(w, "only the CONNECT method is supported", http.StatusMethodNotAllowed)
		return
	}
	if err := checkDialAddress(r.Host); err != nil {
		// A target the agent could not dial would cost a DIAL_REQ, a
		// pending dial and an agent's dial attempt for a certain failure:
		// answer it here.
		fs.log.V(2).Info("Refused invalid CONNECT target", "address", capPeer(r.Host), "err", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ht := &httpTunnel{fs: fs, dialed: make(chan *client.DialResponse, 1), data: make(chan []byte, queueSize), closed: make(chan struct{}),
		queued: queuedBytes{m: fs.metrics}, flushed: make(chan struct{})}
	// Whatever is left in data when the tunnel ends is dropped with it:
	// here, unless serveTunnel took the tunnel over.
	relayed := false
	defer func() {
		if !relayed {
			ht.queued.stop()
		}
	}()
	t, be, err := fs.dials.start(ht, "tcp", r.Host, 0)
	switch {
	case errors.Is(err, errShuttingDown):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	log := fs.log.WithValues("address", capPeer(r.Host), "agentID", be.logID, "dialID", t.random)

	rsp, ok := fs.awaitDial(w, r, ht, t, be)
	if !ok {
		return
	}
	if rsp.GetError() != "" {
		code := dialErrorStatus(rsp.GetError())
		log.V(2).Info("Dial through the agent failed", "err", capPeer(rsp.GetError()), "status", code)
		http.Error(w, rsp.GetError(), code)
		return
	}

	relayed = fs.relayConnect(w, ht, t, log)
}

// awaitDial sends t's DIAL_REQ to be and waits for the agent's answer.
// The dial's own timer (BackendDialTimeout) answers it if no agent does;
// the answer may come while the request still waits for room in the
// queue of the agent chosen first, when the dial was sent to another one
// meanwhile. ok is false when the request ended first, answered if the
// client is still there.
//
// Once the request is sent the agent's DIAL_RSP may have established the
// tunnel by the time the client's disconnect is handled, even when the
// disconnect was seen first: closeFromFrontend drops the dial if it is
// still pending and otherwise sends CLOSE_REQ, where dropping the pending
// dial alone would leave an established tunnel open forever.
func (fs *frontends) awaitDial(w http.ResponseWriter, r *http.Request, ht *httpTunnel, t *tunnel, be *agentStream) (rsp *client.DialResponse, ok bool) {
	req := wire.DialReq("tcp", r.Host, t.random)
	room, peerDone := be.peer.room, be.peer.done
	for {
		select {
		case room <- struct{}{}:
			be.peer.push(req)
			room, peerDone = nil, nil // sent: the answer is all that is left
		case rsp := <-ht.dialed:
			return rsp, true
		case <-peerDone:
			fs.relay.closeFromFrontend(t)
			http.Error(w, "sending the dial request to the agent failed: agent stream closed", http.StatusBadGateway)
			return nil, false
		case <-r.Context().Done():
			fs.relay.closeFromFrontend(t)
			return nil, false
		case <-fs.life.quit:
			http.Error(w, errShuttingDown.Error(), http.StatusServiceUnavailable)
			return nil, false
		}
	}
}

// relayConnect takes over the client's connection once the agent has
// dialled and hands it to serveTunnel, in a goroutine of its own: the HTTP
// server's goroutine returns, and with it the request, the response and
// their buffers, and a stack grown for parsing and dialling, none of
// which an open tunnel needs.
func (fs *frontends) relayConnect(w http.ResponseWriter, ht *httpTunnel, t *tunnel, log klog.Logger) (relayed bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		fs.relay.closeFromFrontend(t)
		http.Error(w, "cannot take over the connection for CONNECT: "+err.Error(), http.StatusInternalServerError)
		return false
	}
	fs.mu.Lock()
	if fs.life.closed {
		fs.mu.Unlock()
		conn.Close()
		return false
	}
	ht.conn = conn
	fs.httpTunnels[ht] = struct{}{}
	// serveTunnel is counted until it returns, after the last writer: writers
	// start only meanwhile, from goroutines Close waits for.
	fs.life.wg.Add(1)
	fs.mu.Unlock()
	go fs.serveTunnel(ht, t, conn, clientReader(conn, brw.Reader), log)
	return true
}

// serveTunnel answers 200 on the client's connection and relays until
// either side ends the tunnel.
func (fs *frontends) serveTunnel(ht *httpTunnel, t *tunnel, conn net.Conn, r io.Reader, log klog.Logger) {
	defer fs.life.wg.Done()
	defer ht.queued.stop()
	fs.metrics.addHTTPConns(1)
	defer fs.metrics.addHTTPConns(-1)

	log.V(2).Info("HTTP CONNECT tunnel established", "connectionID", t.connectID)
	// The 200 goes out before any writer starts: a target that speaks
	// first (SSH, SMTP, MySQL) has its bytes wait in ht.data meanwhile,
	// and a client would read them as the proxy's answer if they came
	// first.
	_, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n")
	ht.wmu.Lock()
	ht.client = conn
	ht.wmu.Unlock()
	ht.kick()
	if err == nil {
		ht.readLoop(t, r)
	}
	if t.ending.Load() {
		// The agent closed the tunnel while the client was sending: what
		// the agent sent before it is still on its way (pump), and
		// CLOSE_RSP ends it. Each delivery is bounded by the write
		// timeout, so this wait is bounded too.
		select {
		case <-ht.closed:
		case <-fs.life.quit:
		}
	}
	// The client closed, the agent closed (a writer then writes what is
	// queued and closes conn), or Close closed conn. When the agent
	// closed, closing conn here first would cut off the target's last
	// bytes. A client that stops reading is bounded by the write
	// deadline.
	select {
	case <-ht.closed:
		_ = conn.SetWriteDeadline(time.Now().Add(fs.writeTimeout))
		<-ht.flushed
	default:
	}
	fs.relay.closeFromFrontend(t)
	ht.shutdown()
	conn.Close()
	<-ht.flushed // shutdown started a writer, if none ran, to end it
	fs.mu.Lock()
	delete(fs.httpTunnels, ht)
	fs.mu.Unlock()
	fs.life.tunnelMayHaveEnded()
	log.V(2).Info("HTTP CONNECT tunnel closed", "connectionID", t.connectID)
}

// clientReader is what to read the client's bytes from after the hijack:
// conn, after a copy of what the HTTP server had read ahead into br, so
// that br's buffer is not held for the tunnel's life.
func clientReader(conn net.Conn, br *bufio.Reader) io.Reader {
	n := br.Buffered()
	if n == 0 {
		return conn
	}
	ahead, _ := br.Peek(n) // buffered: no error
	return io.MultiReader(bytes.NewReader(bytes.Clone(ahead)), conn)
}

// idleRead is the buffer a client is read into while it sends nothing. A
// read that fills it is followed by reads into pooled buffers of
// MaxDataPayload, each handed on with its packet, until one comes back
// short.
const idleRead = 512

// readLoop relays the client's bytes to the agent until the client
// closes, the tunnel closes, or the Server closes.
func (ht *httpTunnel) readLoop(t *tunnel, r io.Reader) {
	small := make([]byte, idleRead)
	busy := false
	for {
		buf := small
		if busy {
			buf = wire.DataBuffer()
		}
		n, err := r.Read(buf)
		if n > 0 {
			// The packet is sent later by another goroutine: a pooled
			// buffer goes with it (the agent's writer recycles it), the
			// small one is copied.
			data := buf[:n]
			if !busy {
				data = bytes.Clone(data)
			}
			if !ht.fs.relay.sendData(t, wire.Data(t.connectID, data), ht.closed) {
				return
			}
		} else if busy {
			wire.Recycle(buf)
		}
		if err != nil {
			return
		}
		busy = n == len(buf)
	}
}

// shutdown stops the tunnel's loops, once, and has a writer end the
// connection.
func (ht *httpTunnel) shutdown() {
	ht.once.Do(func() { close(ht.closed) })
	ht.kick()
}

// closeConn closes the client connection (for Server.Close).
func (ht *httpTunnel) closeConn() {
	ht.fs.mu.Lock()
	conn := ht.conn
	ht.fs.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

func (ht *httpTunnel) deliver(pkt *client.Packet, abort <-chan struct{}) {
	switch pkt.GetType() {
	case client.PacketType_DIAL_RSP:
		select {
		case ht.dialed <- pkt.GetDialResponse():
		default: // a second answer cannot happen: the dial is answered once
		}
	case client.PacketType_DATA:
		if len(pkt.GetData().GetData()) == 0 {
			return
		}
		select {
		case ht.data <- pkt.GetData().GetData():
			ht.queued.add(dataLen(pkt))
			ht.kick()
			return
		default:
		}
		ht.kick() // one runs already: data is full
		timer := time.NewTimer(ht.fs.writeTimeout)
		defer timer.Stop()
		select {
		case ht.data <- pkt.GetData().GetData():
			ht.queued.add(dataLen(pkt))
			ht.kick()
		case <-ht.closed:
		case <-ht.fs.life.quit:
		case <-abort:
		case <-timer.C:
			ht.fs.logs.info(ht.fs.log, "slow-client", "Closed an HTTP CONNECT client that did not read for too long", "timeout", ht.fs.writeTimeout)
			ht.shutdown()
			ht.closeConn()
		}
	case client.PacketType_CLOSE_RSP:
		ht.shutdown()
	}
}

// answer is deliver: a DIAL_RSP or CLOSE_RSP never waits here.
func (ht *httpTunnel) answer(pkt *client.Packet) { ht.deliver(pkt, nil) }

func (ht *httpTunnel) track(*tunnel)            {}
func (ht *httpTunnel) established(*tunnel) bool { return true }
func (ht *httpTunnel) forget(*tunnel)           {}

// checkDialAddress accepts host:port with a non-empty host and a port
// from 1 to 65535, the only form of address an agent can dial over TCP
// (and the authority-form of a CONNECT target, RFC 9110, section 9.3.6).
func checkDialAddress(address string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("invalid target %q: want host:port", capPeer(address))
	}
	if host == "" {
		return fmt.Errorf("invalid target %q: the host is empty", capPeer(address))
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("invalid target %q: want a port from 1 to 65535", capPeer(address))
	}
	return nil
}

// dialErrorStatus maps an agent's dial error to the HTTP status of the
// CONNECT response, as upstream does.
func dialErrorStatus(errText string) int {
	lower := strings.ToLower(errText)
	switch {
	case strings.Contains(lower, "timeout"), strings.Contains(lower, "timed out"):
		return http.StatusGatewayTimeout
	case strings.Contains(lower, "too many open files"):
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadGateway
	}
}
