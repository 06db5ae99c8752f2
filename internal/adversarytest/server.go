package adversarytest

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// Wait bounds every wait of a method that takes a testing.TB: it fails
// the test when nothing came within it.
const Wait = 10 * time.Second

// maxStreams bounds the streams a HostileServer keeps for the test to
// take; a stream beyond them is refused.
const maxStreams = 1024

// streamBuffer is how many of an agent's packets a stream holds for the
// test before it stops reading the agent.
const streamBuffer = 4096

// ServerConfig says what a [HostileServer] sends in its handshake.
type ServerConfig struct {
	// Creds are the server's transport credentials; nil means plaintext.
	Creds credentials.TransportCredentials
	// Listener, if set, is served instead of a new listener on
	// 127.0.0.1:0; the server closes it.
	Listener net.Listener
	// ID is the serverID header.
	ID string
	// NewIDPerStream sends ID-1, ID-2, ... on successive streams, as a
	// hostile server once did, so that each stream looks like one
	// more server to the agent.
	NewIDPerStream bool
	// Count is the serverCount header exactly as sent: "1000000000",
	// "-1" and "x" are all fine.
	Count string
	// OmitID and OmitCount leave the header out.
	OmitID, OmitCount bool
	// Deaf makes the server read nothing from its agents after the
	// handshake: what an agent sends stays in gRPC's windows, and its
	// Send blocks once they are full.
	Deaf bool
	// Metadata are more response headers, as key, value pairs: for
	// example wire.HeaderTunnelWindow, to turn flow control on and then
	// break its rules.
	Metadata []string
}

// HostileServer is a proxy-server's agent port that does exactly what the
// test says: it answers each agent's /AgentService/Connect with the
// headers of its [ServerConfig] and then hands the stream to the test as
// a [ServerStream], to send whatever packets it likes (DIAL_REQ floods,
// malformed packets) and to read the agent's. It is safe for concurrent
// use.
type HostileServer struct {
	cfg  ServerConfig
	addr string
	gs   *grpc.Server
	// opened counts the Connect streams accepted.
	opened atomic.Int64
	// streams holds the accepted streams, oldest first, for NextStream.
	streams chan *ServerStream
}

// ServerStream is one agent's Connect stream as a [HostileServer] sees it.
// The agent's packets are read into a buffer of a few thousand; when it is
// full the server stops reading, as a server whose agent queue is full
// does.
type ServerStream struct {
	md       metadata.MD
	serverID string
	stream   wire.AgentConnectServer
	sendMu   sync.Mutex // serialises Send, as gRPC requires
	// recv carries the agent's packets.
	recv chan *client.Packet
	// end is closed by End; endOnce guards it.
	end     chan struct{}
	endOnce sync.Once
	// done is closed when the handler has returned: the stream is over.
	done chan struct{}
}

// StartHostileServer serves cfg on loopback until the test ends.
func StartHostileServer(tb testing.TB, cfg ServerConfig) *HostileServer {
	tb.Helper()
	lis := cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			tb.Fatalf("adversary: hostile server: %v", err)
		}
	}
	var opts []grpc.ServerOption
	if cfg.Creds != nil {
		opts = append(opts, grpc.Creds(cfg.Creds))
	}
	// WaitForHandlers: Stop returns once every Connect handler has, so no
	// goroutine outlives the test.
	opts = append(opts, grpc.WaitForHandlers(true))
	s := &HostileServer{
		cfg:     cfg,
		addr:    lis.Addr().String(),
		gs:      grpc.NewServer(opts...),
		streams: make(chan *ServerStream, maxStreams),
	}
	wire.RegisterAgentServiceServer(s.gs, s)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.gs.Serve(lis) // returns when stopped
	}()
	tb.Cleanup(func() {
		s.Stop()
		<-served
	})
	return s
}

// Addr returns the server's address, host:port.
func (s *HostileServer) Addr() string { return s.addr }

// Opened returns how many Connect streams the server has accepted.
func (s *HostileServer) Opened() int64 { return s.opened.Load() }

// Stop closes the listener and every stream, and waits for the handlers.
// It may be called more than once.
func (s *HostileServer) Stop() { s.gs.Stop() }

// Connect implements wire.AgentServiceServer.
func (s *HostileServer) Connect(stream wire.AgentConnectServer) error {
	n := s.opened.Add(1)
	md, _ := metadata.FromIncomingContext(stream.Context())
	id := s.cfg.ID
	if s.cfg.NewIDPerStream {
		id += "-" + strconv.FormatInt(n, 10)
	}
	hdr := metadata.MD{}
	if !s.cfg.OmitID {
		hdr.Set(wire.HeaderServerID, id)
	}
	if !s.cfg.OmitCount {
		hdr.Set(wire.HeaderServerCount, s.cfg.Count)
	}
	hdr = metadata.Join(hdr, metadata.Pairs(s.cfg.Metadata...))
	if err := stream.SendHeader(hdr); err != nil {
		return err
	}
	ss := &ServerStream{md: md, serverID: id, stream: stream, recv: make(chan *client.Packet, streamBuffer),
		end: make(chan struct{}), done: make(chan struct{})}
	defer close(ss.done)
	select {
	case s.streams <- ss:
	default:
		return errors.New("adversary: hostile server: too many streams")
	}
	if s.cfg.Deaf {
		select {
		case <-stream.Context().Done():
		case <-ss.end:
		}
		return nil
	}
	// The reader stops when the handler returns: gRPC then cancels the
	// stream's context, which ends Recv.
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			p, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case ss.recv <- p:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	select {
	case <-read:
		return nil
	case <-ss.end:
		return nil
	}
}

// NextStream returns the next stream the server accepted, failing the
// test if none comes within [Wait].
func (s *HostileServer) NextStream(tb testing.TB) *ServerStream {
	tb.Helper()
	select {
	case ss := <-s.streams:
		return ss
	case <-time.After(Wait):
		tb.Fatalf("adversary: hostile server %s accepted no stream within %v", s.cfg.ID, Wait)
		return nil
	}
}

// TakeStreams returns the streams the server accepted that NextStream has
// not returned, oldest first, without waiting.
func (s *HostileServer) TakeStreams() []*ServerStream {
	var all []*ServerStream
	for {
		select {
		case ss := <-s.streams:
			all = append(all, ss)
		default:
			return all
		}
	}
}

// Metadata returns the agent's handshake headers.
func (ss *ServerStream) Metadata() metadata.MD { return ss.md }

// ServerID returns the serverID header the stream was answered with.
func (ss *ServerStream) ServerID() string { return ss.serverID }

// SendPacket sends p to the agent.
func (ss *ServerStream) SendPacket(p *client.Packet) error {
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	return ss.stream.Send(p)
}

// Send sends p to the agent, failing the test if it cannot.
func (ss *ServerStream) Send(tb testing.TB, p *client.Packet) {
	tb.Helper()
	if err := ss.SendPacket(p); err != nil {
		tb.Fatalf("adversary: sending %v to the agent: %v", p.GetType(), err)
	}
}

// FloodDialReqs sends n DIAL_REQs for address with randoms 1 to n,
// without waiting for any answer, as a hostile server once did.
func (ss *ServerStream) FloodDialReqs(tb testing.TB, address string, n int) {
	tb.Helper()
	for i := range n {
		ss.Send(tb, wire.DialReq("tcp", address, int64(i+1)))
	}
}

// Packets returns the agent's packets, in order, for a test that reads
// them itself; Next and NextOf read from it too.
func (ss *ServerStream) Packets() <-chan *client.Packet { return ss.recv }

// Next returns the agent's next packet, failing the test if none comes
// within [Wait].
func (ss *ServerStream) Next(tb testing.TB) *client.Packet {
	tb.Helper()
	select {
	case p := <-ss.recv:
		return p
	case <-time.After(Wait):
		tb.Fatalf("adversary: no packet from the agent within %v", Wait)
		return nil
	}
}

// NextOf returns the agent's next packet and fails the test unless it
// is of type typ.
func (ss *ServerStream) NextOf(tb testing.TB, typ client.PacketType) *client.Packet {
	tb.Helper()
	p := ss.Next(tb)
	if p.GetType() != typ {
		tb.Fatalf("adversary: the agent sent %v, want %v", p, typ)
	}
	return p
}

// DialOK sends DIAL_REQ for address and returns the connectID of the
// agent's DIAL_RSP, failing the test unless the dial succeeded.
func (ss *ServerStream) DialOK(tb testing.TB, address string, random int64) int64 {
	tb.Helper()
	ss.Send(tb, wire.DialReq("tcp", address, random))
	rsp := ss.NextOf(tb, client.PacketType_DIAL_RSP).GetDialResponse()
	if rsp.GetError() != "" || rsp.GetRandom() != random || rsp.GetConnectID() <= 0 {
		tb.Fatalf("adversary: DIAL_RSP %v, want success for random %d", rsp, random)
	}
	return rsp.GetConnectID()
}

// End ends the stream from the server's side, as a proxy-server that
// goes away does, and waits until it is over. It may be called more
// than once.
func (ss *ServerStream) End() {
	ss.endOnce.Do(func() { close(ss.end) })
	<-ss.done
}

// Done returns a channel that is closed when the stream is over.
func (ss *ServerStream) Done() <-chan struct{} { return ss.done }

// Ended reports whether the stream is over.
func (ss *ServerStream) Ended() bool {
	select {
	case <-ss.done:
		return true
	default:
		return false
	}
}
