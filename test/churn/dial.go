package churn

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

// ConnectOverUnix returns a Dialer through a proxy-server's HTTP CONNECT
// frontend on a Unix socket, as kube-apiserver's HTTPConnect egress over
// UDS: a new connection per tunnel, CONNECT, and a 200.
func ConnectOverUnix(socket string) Dialer {
	return connectVia(socket, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	})
}

// ConnectOverTLS is ConnectOverUnix to a frontend port over TCP with
// cfg's (mutual) TLS, as kube-apiserver's HTTPConnect egress over TCP.
func ConnectOverTLS(server string, cfg *tls.Config) Dialer {
	return connectVia(server, func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", server)
	})
}

func connectVia(server string, dial func(context.Context) (net.Conn, error)) Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect to the proxy-server's frontend %s: %w", server, err)
		}
		// Until the 200, ctx bounds the handshake; after, the connection
		// lives as long as ctx, as Dialer asks.
		context.AfterFunc(ctx, func() { _ = c.Close() })
		if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("send CONNECT %s: %w", addr, err)
		}
		br := bufio.NewReader(c)
		rsp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("read the answer to CONNECT %s: %w", addr, err)
		}
		if rsp.StatusCode != http.StatusOK {
			_ = c.Close()
			return nil, fmt.Errorf("CONNECT %s: %s", addr, rsp.Status)
		}
		if br.Buffered() == 0 {
			return c, nil
		}
		return &bufferedConn{Conn: c, r: br}, nil
	}
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// GRPCOverUnix returns a Dialer through a proxy-server's gRPC frontend on
// a Unix socket, as kube-apiserver's GRPC egress: a new gRPC connection
// and single-use tunnel per dial, made with the konnectivity-client
// library, that ends when ctx does.
func GRPCOverUnix(socket string) Dialer {
	return grpcVia(socket,
		grpc.WithContextDialer(func(ctx context.Context, socket string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// GRPCOverTLS is GRPCOverUnix to a frontend port over TCP with cfg's
// (mutual) TLS.
func GRPCOverTLS(server string, cfg *tls.Config) Dialer {
	return grpcVia(server, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

func grpcVia(server string, opts ...grpc.DialOption) Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		tunnel, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, ctx, server, opts...)
		if err != nil {
			return nil, fmt.Errorf("create a gRPC tunnel to %s: %w", server, err)
		}
		conn, err := tunnel.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s through the gRPC tunnel: %w", addr, err)
		}
		return conn, nil
	}
}

// OverUnix is the Dialer kube-apiserver uses through a proxy-server's
// frontend on a Unix socket in mode: "grpc" (GRPCOverUnix) or
// "http-connect" (ConnectOverUnix).
func OverUnix(mode, socket string) Dialer {
	if mode == "grpc" {
		return GRPCOverUnix(socket)
	}
	return ConnectOverUnix(socket)
}

// GRPCSharedOverUnix returns a Dialer through a proxy-server's gRPC
// frontend on a Unix socket whose tunnels all share one gRPC connection:
// konnectivity-client's reusable tunnel (CreateGRPCTunnel), one Proxy
// stream per dial, as kube-apiserver may multiplex its egress. The
// connection closes when ctx ends; a tunnel's when its dial's ctx does.
func GRPCSharedOverUnix(ctx context.Context, socket string) (Dialer, error) {
	tunnel, err := konnectivity.CreateGRPCTunnel(ctx, socket,
		grpc.WithContextDialer(func(ctx context.Context, socket string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("create a reusable gRPC tunnel to %s: %w", socket, err)
	}
	context.AfterFunc(ctx, func() { _ = tunnel.Close() })
	return func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := tunnel.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s through the shared gRPC connection: %w", addr, err)
		}
		context.AfterFunc(ctx, func() { _ = conn.Close() })
		return conn, nil
	}, nil
}
