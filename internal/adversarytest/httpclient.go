package adversarytest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
)

// HTTPClientConfig says how a [DeafHTTPClient] reaches a proxy-server's
// HTTP CONNECT port.
type HTTPClientConfig struct {
	// Addr is the HTTP CONNECT port, host:port.
	Addr string
	// TLS is the client-side TLS configuration; nil means plain HTTP.
	TLS *tls.Config
}

// DeafHTTPClient is an HTTP CONNECT client that has its tunnel and never
// reads what comes through it, as slow clients once did. It may write.
type DeafHTTPClient struct {
	conn net.Conn
	br   *bufio.Reader // holds what came with the response head
}

// DialDeafHTTPClient sends CONNECT target to the server and reads the
// response head. A status other than 200 is an error that names it; ctx
// bounds the dial and the wait for the response. The connection stays
// open until Close.
func DialDeafHTTPClient(ctx context.Context, cfg HTTPClientConfig, target string) (*DeafHTTPClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("adversary: HTTP CONNECT client: %w", err)
	}
	if cfg.TLS != nil {
		conn = tls.Client(conn, cfg.TLS)
	}
	// The context bounds the handshake: closing the connection ends any
	// read or write in progress.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	c := &DeafHTTPClient{conn: conn, br: bufio.NewReader(conn)}
	err = c.handshake(target)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("adversary: CONNECT %s via %s: %w", target, cfg.Addr, err)
	}
	return c, nil
}

func (c *DeafHTTPClient) handshake(target string) error {
	if _, err := fmt.Fprintf(c.conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// Write writes to the tunnel.
func (c *DeafHTTPClient) Write(p []byte) (int, error) { return c.conn.Write(p) }

// WaitClosed reads and drops what the tunnel sent until the server
// closes the connection, and returns how many bytes it read. A reset
// connection counts as closed; ctx ends the wait with its error.
func (c *DeafHTTPClient) WaitClosed(ctx context.Context) (int64, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.conn.Close() })
	defer stop()
	n, err := io.Copy(io.Discard, c.br)
	if ctx.Err() != nil {
		return n, ctx.Err()
	}
	var op *net.OpError
	if errors.As(err, &op) && !errors.Is(err, net.ErrClosed) {
		err = nil // reset by the server: closed
	}
	return n, err
}

// Close closes the client's connection.
func (c *DeafHTTPClient) Close() error { return c.conn.Close() }
