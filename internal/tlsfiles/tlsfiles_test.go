package tlsfiles_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/logtest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/tlsfiles"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// secretVolume lays files out as a Kubernetes Secret volume does: each
// name is a symlink to ..data/name, and ..data a symlink to a directory
// of the version. update swaps ..data atomically to a new version.
type secretVolume struct {
	t       *testing.T
	dir     string
	version int
}

func newSecretVolume(t *testing.T, files map[string][]byte) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.update(files)
	for name := range files {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)))
	}
	return v
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

func (v *secretVolume) update(files map[string][]byte) {
	v.version++
	ver := fmt.Sprintf("..v%d", v.version)
	require.NoError(v.t, os.Mkdir(filepath.Join(v.dir, ver), 0o755))
	for name, b := range files {
		require.NoError(v.t, os.WriteFile(filepath.Join(v.dir, ver, name), b, 0o600))
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	require.NoError(v.t, os.Symlink(ver, tmp))
	require.NoError(v.t, os.Rename(tmp, filepath.Join(v.dir, "..data")))
}

func newCA(t *testing.T, name string) *pkitest.CA {
	ca, err := pkitest.NewCA(name)
	require.NoError(t, err)
	return ca
}

func serverPair(t *testing.T, ca *pkitest.CA) *pkitest.Pair {
	p, err := ca.Server("server")
	require.NoError(t, err)
	return p
}

func clientPair(t *testing.T, ca *pkitest.CA) *pkitest.Pair {
	p, err := ca.Client("client")
	require.NoError(t, err)
	return p
}

func serial(p *pkitest.Pair) *big.Int { return p.TLS.Leaf.SerialNumber }

// echoServer serves TLS with cfg on loopback and echoes every
// connection until the test ends.
func echoServer(t *testing.T, cfg *tls.Config) string {
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	return l.Addr().String()
}

// handshake connects with cfg and returns the connection, whose peer
// certificate the test can read; it echoes a byte first, so that a
// refusal on either side shows as an error.
func handshake(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn)
	if err := echo(tc); err != nil {
		tc.Close()
		return nil, err
	}
	t.Cleanup(func() { tc.Close() })
	return tc, nil
}

func echo(c *tls.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{42}); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if b[0] != 42 {
		return fmt.Errorf("echoed %d", b[0])
	}
	return nil
}

func servedSerial(c *tls.Conn) *big.Int {
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

func run(t *testing.T, w *tlsfiles.Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A server whose certificate a Secret volume rotates (a symlink swap)
// presents the new one in new handshakes, without a restart, and an
// open connection goes on working.
func TestServerPicksUpARotatedCertificate(t *testing.T) {
	ca := newCA(t, "ca")
	old, next := serverPair(t, ca), serverPair(t, ca)
	vol := newSecretVolume(t, map[string][]byte{"tls.crt": old.CertPEM, "tls.key": old.KeyPEM})
	w, err := tlsfiles.New("test port", tlsfiles.Files{Cert: vol.path("tls.crt"), Key: vol.path("tls.key")}, nil, klog.Background().V(9))
	require.NoError(t, err)
	w.Interval = time.Hour // only the file events may reload
	run(t, w)
	addr := echoServer(t, w.ServerConfig())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}

	open, err := handshake(t, addr, client)
	require.NoError(t, err)
	require.Equal(t, serial(old), servedSerial(open))

	vol.update(map[string][]byte{"tls.crt": next.CertPEM, "tls.key": next.KeyPEM})
	require.Eventually(t, func() bool {
		c, err := handshake(t, addr, client)
		return err == nil && servedSerial(c).Cmp(serial(next)) == 0
	}, 20*time.Second, 20*time.Millisecond, "new handshakes still present the old certificate")
	assert.NoError(t, echo(open), "the connection opened before the rotation")
}

// A new certificate file that does not parse, or a key that is not the
// certificate's, leaves the last good pair in use; the failure is logged
// at level 0 and counted, and the next good file is taken.
func TestBadFilesKeepTheLastGoodPair(t *testing.T) {
	ca := newCA(t, "ca")
	good, other, next := serverPair(t, ca), serverPair(t, ca), serverPair(t, ca)
	dir := t.TempDir()
	certFile, keyFile, err := good.WriteFiles(dir, "tls")
	require.NoError(t, err)
	metrics := tlsfiles.NewMetrics("test", "tls")
	logger, logs := logtest.NewLogger(0)
	w, err := tlsfiles.New("test port", tlsfiles.Files{Cert: certFile, Key: keyFile}, metrics, logger)
	require.NoError(t, err)
	addr := echoServer(t, w.ServerConfig())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	for name, cert := range map[string][]byte{
		"garbage":             []byte("not a certificate"),
		"another pair's cert": other.CertPEM,
	} {
		require.NoError(t, os.WriteFile(certFile, cert, 0o644), name)
		require.Error(t, w.Reload(), name)
		c, err := handshake(t, addr, client)
		require.NoError(t, err, name)
		assert.Equal(t, serial(good), servedSerial(c), "%s: the last good certificate stays", name)
	}
	assert.Contains(t, logs.String(), "test port", "logged at level 0")
	assert.Equal(t, 2.0, testutil.ToFloat64(metricOf(t, metrics, "certificate_reloads_total", "test port", "error")))

	require.NoError(t, os.WriteFile(certFile, next.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(keyFile, next.KeyPEM, 0o600))
	require.NoError(t, w.Reload())
	c, err := handshake(t, addr, client)
	require.NoError(t, err)
	assert.Equal(t, serial(next), servedSerial(c))
	assert.Contains(t, logs.String(), "Recovered")
	assert.Equal(t, float64(next.TLS.Leaf.NotAfter.Unix()),
		testutil.ToFloat64(metricOf(t, metrics, "certificate_expiry_timestamp_seconds", "test port", "leaf")))
}

// A CA rotation on the server's client-CA bundle, as operators do it:
// the new CA is added beside the old, clients move to certificates of
// the new one, then the old CA is removed. Each step takes effect at the
// next handshake.
func TestServerFollowsItsClientCABundle(t *testing.T) {
	oldCA, newCA := newCA(t, "old"), newCA(t, "new")
	dir := t.TempDir()
	srv := serverPair(t, oldCA)
	certFile, keyFile, err := srv.WriteFiles(dir, "tls")
	require.NoError(t, err)
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, oldCA.PEM, 0o644))
	w, err := tlsfiles.New("test port", tlsfiles.Files{Cert: certFile, Key: keyFile, CA: caFile}, nil, klog.Background().V(9))
	require.NoError(t, err)
	addr := echoServer(t, w.ServerConfig())
	clientOf := func(ca *pkitest.CA) *tls.Config {
		return &tls.Config{RootCAs: oldCA.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{clientPair(t, ca).TLS}}
	}

	_, err = handshake(t, addr, clientOf(oldCA))
	require.NoError(t, err, "old CA's client, old bundle")
	_, err = handshake(t, addr, clientOf(newCA))
	require.Error(t, err, "new CA's client, old bundle")
	_, err = handshake(t, addr, &tls.Config{RootCAs: oldCA.Pool(), ServerName: "localhost"})
	require.Error(t, err, "a client without a certificate")

	require.NoError(t, os.WriteFile(caFile, append(append([]byte{}, oldCA.PEM...), newCA.PEM...), 0o644))
	require.NoError(t, w.Reload())
	_, err = handshake(t, addr, clientOf(oldCA))
	require.NoError(t, err, "old CA's client, both in the bundle")
	_, err = handshake(t, addr, clientOf(newCA))
	require.NoError(t, err, "new CA's client, both in the bundle")

	require.NoError(t, os.WriteFile(caFile, newCA.PEM, 0o644))
	require.NoError(t, w.Reload())
	_, err = handshake(t, addr, clientOf(oldCA))
	require.Error(t, err, "old CA's client, new bundle")
	_, err = handshake(t, addr, clientOf(newCA))
	require.NoError(t, err, "new CA's client, new bundle")
}

// A client checks the server against its CA bundle of the moment, and the
// server's name, as Go's own check does; and presents its current
// certificate.
func TestClientFollowsItsCABundleAndCertificate(t *testing.T) {
	oldCA, newCA := newCA(t, "old"), newCA(t, "new")
	serverCA := newCA
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, oldCA.PEM, 0o644))
	cl := clientPair(t, serverCA)
	certFile, keyFile, err := cl.WriteFiles(dir, "client")
	require.NoError(t, err)
	w, err := tlsfiles.New("test client", tlsfiles.Files{Cert: certFile, Key: keyFile, CA: caFile}, nil, klog.Background().V(9))
	require.NoError(t, err)

	srv := serverPair(t, serverCA)
	var mu sync.Mutex
	var seen []*big.Int
	addr := echoServer(t, &tls.Config{
		Certificates: []tls.Certificate{srv.TLS}, ClientCAs: serverCA.Pool(), ClientAuth: tls.RequireAndVerifyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, cs.PeerCertificates[0].SerialNumber)
			return nil
		},
	})

	_, err = handshake(t, addr, w.ClientConfig("localhost"))
	require.Error(t, err, "a server of another CA")

	require.NoError(t, os.WriteFile(caFile, newCA.PEM, 0o644))
	require.NoError(t, w.Reload())
	_, err = handshake(t, addr, w.ClientConfig("localhost"))
	require.NoError(t, err, "the server's CA is trusted now")
	_, err = handshake(t, addr, w.ClientConfig("not-the-server.example"))
	require.Error(t, err, "a name the certificate does not have")

	next := clientPair(t, serverCA)
	require.NoError(t, os.WriteFile(certFile, next.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(keyFile, next.KeyPEM, 0o600))
	require.NoError(t, w.Reload())
	_, err = handshake(t, addr, w.ClientConfig("localhost"))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	assert.Equal(t, serial(next), seen[len(seen)-1], "the client presents its new certificate")
}

// The first reading must work: a binary does not start with files it
// cannot use. A CA bundle with a PEM block that does not decode is
// refused, wherever the block is; text between blocks is not a block.
func TestNewRefusesUnusableFiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.crt")
	require.NoError(t, os.WriteFile(bad, []byte("x"), 0o644))
	good := newCA(t, "good").PEM
	broken := "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n"
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
		return path
	}
	malformedLast := write("malformed-last.crt", string(good)+broken)
	malformedFirst := write("malformed-first.crt", broken+string(good))
	commented := write("commented.crt", "Bag Attributes\n    friendlyName: good\n"+string(good)+"# the end\n")
	_, err := tlsfiles.New("test", tlsfiles.Files{CA: commented}, nil, klog.Background().V(9))
	require.NoError(t, err, "text between PEM blocks")
	errs := tlsfiles.Check(tlsfiles.Files{CA: malformedLast}, tlsfiles.Files{CA: "--cluster-ca-cert"})
	require.Len(t, errs, 1)
	assert.ErrorContains(t, errs[0], "--cluster-ca-cert: CA bundle "+malformedLast+": a malformed PEM block")
	for name, f := range map[string]tlsfiles.Files{
		"missing":         {Cert: filepath.Join(dir, "none.crt"), Key: filepath.Join(dir, "none.key")},
		"garbage":         {Cert: bad, Key: bad},
		"empty bundle":    {CA: bad},
		"missing CA":      {CA: filepath.Join(dir, "none.crt")},
		"malformed last":  {CA: malformedLast},
		"malformed first": {CA: malformedFirst},
	} {
		_, err := tlsfiles.New("test", f, nil, klog.Background().V(9))
		assert.Error(t, err, name)
	}
}

// metricOf is the series of metrics' metric name (less its prefix) with
// labels.
func metricOf(t *testing.T, m *tlsfiles.Metrics, name string, labels ...string) prometheus.Collector {
	t.Helper()
	for _, c := range m.Collectors() {
		descs := make(chan *prometheus.Desc, 1)
		c.Describe(descs)
		if !strings.Contains((<-descs).String(), `"test_tls_`+name+`"`) {
			continue
		}
		switch v := c.(type) {
		case *prometheus.GaugeVec:
			return v.WithLabelValues(labels...)
		case *prometheus.CounterVec:
			return v.WithLabelValues(labels...)
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}
