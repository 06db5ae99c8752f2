package adversarytest

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/pkg/wire"
)

// FrontendConfig says how a [DeafFrontend] reaches a proxy-server's gRPC
// frontend port.
type FrontendConfig struct {
	// Addr is the frontend port, host:port. It is dialled only when Conn
	// is nil.
	Addr string
	// TLS is the client-side TLS configuration for Addr; nil means
	// plaintext.
	TLS *tls.Config
	// Conn, if set, carries the stream instead of a connection of the
	// frontend's own; the caller closes it.
	Conn grpc.ClientConnInterface
}

// DeafFrontend is a /ProxyService/Proxy client, as kube-apiserver's
// konnectivity-client is, that reads nothing unless the test calls
// [DeafFrontend.Recv] or [DeafFrontend.Dial]: what the tunnel's endpoint
// sends piles up in gRPC's windows and in the server's queue for this
// frontend. Sends are serialised.
//
// A DeafFrontend starts no goroutine of its own; [DeafFrontend.Close]
// ends its stream and frees everything it holds.
type DeafFrontend struct {
	deafStream
}

// DialDeafFrontend opens a frontend stream. It lives until ctx is done or
// Close is called.
func DialDeafFrontend(ctx context.Context, cfg FrontendConfig) (*DeafFrontend, error) {
	f := &DeafFrontend{}
	conn, err := f.connect(cfg.Conn, cfg.Addr, cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("adversary: frontend connection to %s: %w", cfg.Addr, err)
	}
	ctx, f.cancel = context.WithCancel(ctx)
	stream, err := client.NewProxyServiceClient(conn).Proxy(ctx)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("adversary: frontend stream to %s: %w", cfg.Addr, err)
	}
	f.stream = stream
	return f, nil
}

// Dial asks for a tunnel to address over TCP and reads packets until the
// DIAL_RSP for random: it returns the connectID, or the agent's dial
// error. The frontend is deaf again afterwards.
func (f *DeafFrontend) Dial(address string, random int64) (int64, error) {
	if err := f.Send(wire.DialReq("tcp", address, random)); err != nil {
		return 0, fmt.Errorf("adversary: sending DIAL_REQ for %s: %w", address, err)
	}
	for {
		p, err := f.Recv()
		if err != nil {
			return 0, fmt.Errorf("adversary: waiting for the DIAL_RSP for %s: %w", address, err)
		}
		rsp := p.GetDialResponse()
		if p.GetType() != client.PacketType_DIAL_RSP || rsp.GetRandom() != random {
			continue
		}
		if rsp.GetError() != "" {
			return 0, fmt.Errorf("adversary: dial %s refused: %s", address, rsp.GetError())
		}
		return rsp.GetConnectID(), nil
	}
}

// WaitEnded reads and drops packets until the server ends the stream, and
// returns the status it ended it with (nil for a clean end). A frontend
// the server tore down for not reading ends this way once the packets
// already buffered for it are read. Close, or the context the frontend
// was dialled with, ends the wait.
func (f *DeafFrontend) WaitEnded() error {
	for {
		if _, err := f.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
