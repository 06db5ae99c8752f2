package adversarytest

import (
	"context"
	"crypto/tls"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// deafStream is the stream of a deaf gRPC peer ([DeafAgent],
// [DeafFrontend]), which reads only when the test makes it, with what it
// ends on close: the stream's context and the connection the peer dialled
// itself.
type deafStream struct {
	stream interface {
		Send(*client.Packet) error
		Recv() (*client.Packet, error)
	}
	sendMu sync.Mutex // serialises Send, as gRPC requires

	cancel context.CancelFunc
	// owned is the connection the peer dialled, nil when the caller
	// supplied one.
	owned     *grpc.ClientConn
	closeOnce sync.Once
}

// connect returns conn when it is set (the caller keeps and closes it),
// or else a new connection of the peer's own to addr with tlsCfg
// (plaintext when nil) and opts.
func (s *deafStream) connect(conn grpc.ClientConnInterface, addr string, tlsCfg *tls.Config, opts ...grpc.DialOption) (grpc.ClientConnInterface, error) {
	if conn != nil {
		return conn, nil
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	cc, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return nil, err
	}
	s.owned = cc
	return cc, nil
}

// Send sends p to the server. Several goroutines may send at once.
func (s *deafStream) Send(p *client.Packet) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(p)
}

// Recv reads the server's next packet: the peer hears one packet. Only
// one goroutine may call Recv at a time.
func (s *deafStream) Recv() (*client.Packet, error) {
	return s.stream.Recv()
}

// Close ends the stream and closes the connection the peer dialled. It
// may be called more than once.
func (s *deafStream) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		if s.owned != nil {
			_ = s.owned.Close()
		}
	})
}
