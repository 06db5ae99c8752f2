// Package pkitest makes short-lived certificates for tests, benchmarks, the
// demo and `make certs`: a CA, server certificates for loopback names and
// client certificates, with ECDSA P-256 keys.
package pkitest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs server and client certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate in PEM form.
	PEM []byte
}

// Pair is a certificate and its key, in PEM and ready for crypto/tls.
type Pair struct {
	CertPEM, KeyPEM []byte
	TLS             tls.Certificate
}

// NewCA returns a CA named name, valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for names, which may be DNS names or
// IP addresses; "localhost", 127.0.0.1 and ::1 are always included.
func (ca *CA) Server(cn string, names ...string) (*Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageServerAuth, append(names, "localhost", "127.0.0.1", "::1"))
}

// Client issues a client certificate for cn, with names, DNS names or IP
// addresses, as its SANs.
func (ca *CA) Client(cn string, names ...string) (*Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageClientAuth, names)
}

func (ca *CA) issue(cn string, usage x509.ExtKeyUsage, names []string) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %s: %w", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("create certificate for %s: %w", cn, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	p := &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	p.TLS, err = tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	return p, err
}

// WriteFiles writes the pair as dir/name.crt and dir/name.key (mode 0600).
func (p *Pair) WriteFiles(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, p.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, p.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteFile writes the CA certificate as dir/name.crt.
func (ca *CA) WriteFile(dir, name string) (string, error) {
	f := filepath.Join(dir, name+".crt")
	return f, os.WriteFile(f, ca.PEM, 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// Files are a CA's certificate and a server's and an agent's certificate
// and key, as PEM files: what a proxy-server and a proxy-agent process
// are started with.
type Files struct {
	CA                    string
	ServerCert, ServerKey string
	AgentCert, AgentKey   string
}

// TempFiles makes a CA named name and writes its Files into a temporary
// directory of tb's, which the test removes; it fails tb on an error.
// Tests that run the binaries as processes start with it.
func TempFiles(tb testing.TB, name string) (*CA, Files) {
	tb.Helper()
	ca, err := NewCA(name)
	if err != nil {
		tb.Fatalf("pki: %v", err)
	}
	f, err := ca.WriteFiles(tb.TempDir())
	if err != nil {
		tb.Fatalf("pki: %v", err)
	}
	return ca, f
}

// WriteFiles issues a server certificate for "proxy-server" (localhost,
// 127.0.0.1, ::1) and a client certificate for "proxy-agent", and writes
// them with ca's certificate into dir.
func (ca *CA) WriteFiles(dir string) (Files, error) {
	var f Files
	var err error
	if f.CA, err = ca.WriteFile(dir, "ca"); err != nil {
		return f, err
	}
	sp, err := ca.Server("proxy-server")
	if err != nil {
		return f, err
	}
	if f.ServerCert, f.ServerKey, err = sp.WriteFiles(dir, "server"); err != nil {
		return f, err
	}
	ap, err := ca.Client("proxy-agent")
	if err != nil {
		return f, err
	}
	f.AgentCert, f.AgentKey, err = ap.WriteFiles(dir, "agent")
	return f, err
}
