package server

import (
	"crypto/tls"
	"errors"
	"io"
	"net"

	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"
)

// TLSCredentials returns gRPC transport credentials for cfg that log each
// refused TLS handshake (a certificate from another CA, a missing client
// certificate) in one line naming the port and the peer: gRPC itself
// reports them only at its own info level, so an operator would see
// nothing. A handshake the peer refused (it sent a TLS alert, e.g. it
// does not trust the server's certificate) is logged as such. A peer that
// closes before a handshake, as a TCP health check does, is logged only
// at -v=2. logger is the server's ([Config.Logger]).
func TLSCredentials(cfg *tls.Config, port string, logger klog.Logger) credentials.TransportCredentials {
	return loggedCredentials{TransportCredentials: credentials.NewTLS(cfg), port: port, log: logger, logs: new(logLimiter)}
}

type loggedCredentials struct {
	credentials.TransportCredentials
	port string
	log  klog.Logger
	// logs bounds the lines of refused handshakes: anyone can cause them,
	// thousands a second.
	logs *logLimiter
}

func (c loggedCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, info, err := c.TransportCredentials.ServerHandshake(conn)
	var op *net.OpError
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		c.log.V(2).Info("Peer closed before the TLS handshake", "port", c.port, "remote", conn.RemoteAddr().String())
	case errors.As(err, &op) && op.Op == "remote error":
		// crypto/tls reports an alert the peer sent as a "remote error":
		// the peer refused us, most often because it does not trust our
		// certificate, and the fix is on its side (its CA file), not
		// ours.
		c.logs.error(c.log, "peer-refused", errors.New(capPeer(err.Error())), "Peer refused the TLS handshake (does it trust this server's certificate?)", "port", c.port, "remote", conn.RemoteAddr().String())
	default:
		// A certificate's names can be long, and the peer chose them.
		c.logs.error(c.log, "refused", errors.New(capPeer(err.Error())), "Refused TLS connection", "port", c.port, "remote", conn.RemoteAddr().String())
	}
	return nc, info, err
}

func (c loggedCredentials) Clone() credentials.TransportCredentials {
	return loggedCredentials{TransportCredentials: c.TransportCredentials.Clone(), port: c.port, log: c.log, logs: c.logs}
}
