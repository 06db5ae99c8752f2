package pkitest_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/servercount/servercount/internal/pkitest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMutualTLSOverLoopback(t *testing.T) {
	ca, err := pkitest.NewCA("test-ca")
	require.NoError(t, err)
	srvPair, err := ca.Server("server")
	require.NoError(t, err)
	cliPair, err := ca.Client("agent")
	require.NoError(t, err)

	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srvPair.TLS}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert,
	})
	require.NoError(t, err)
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = c.Write([]byte("ok"))
		done <- err
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cliPair.TLS}, ServerName: "localhost"})
	require.NoError(t, err)
	defer c.Close()
	b, err := io.ReadAll(io.LimitReader(c, 2))
	require.NoError(t, err)
	require.Equal(t, "ok", string(b))
	require.NoError(t, <-done)
	_ = net.IPv4len
}
