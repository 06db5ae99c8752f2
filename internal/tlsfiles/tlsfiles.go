// Package tlsfiles keeps the TLS material that the binaries read from
// files current while they run: a certificate and its key, and a bundle of
// CA certificates. cert-manager, kubeadm and Kubernetes Secret volumes
// replace those files in place (a Secret volume swaps a symlink), and a
// process that read them once fails its handshakes with x509 errors when
// the old certificate expires, or when the peer's CA changes, until
// someone restarts it: every agent of a DaemonSet.
//
// A Watcher reads the files once when it is made, then again whenever
// their directory changes (fsnotify) and every Interval as a backstop.
// New handshakes use the newest material that parses; open connections
// are not touched. A new file that does not parse, or a key that does not
// match its certificate, leaves the last good material in use, is logged
// at level 0 once while it lasts (internal/outage), and is counted.
//
// The tls.Config a Watcher gives reads the material at each handshake:
// the certificate through GetCertificate or GetClientCertificate, and the
// CA bundle through VerifyConnection, which checks the peer's chain as the
// standard library would against the bundle of the moment.
package tlsfiles

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/servercount/servercount/internal/outage"
)

// DefaultInterval is how often a Watcher reads its files whatever the
// file system says: some volumes (NFS, some FUSE mounts) send no events.
const DefaultInterval = time.Minute

// settle is how long a Watcher waits after the last file event before it
// reads: a certificate and its key are often written one after the other.
const settle = 100 * time.Millisecond

// Files names the files of one TLS identity. Any may be empty: no
// certificate (a client that presents none, a server port without TLS is
// not a Watcher's), or no CA bundle (a server that asks for no client
// certificate, a client that trusts the system's roots).
type Files struct {
	// Cert and Key are PEM files of a certificate (with its chain) and
	// its private key.
	Cert, Key string
	// CA is a PEM bundle of the CA certificates that peers' certificates
	// must chain to.
	CA string
}

// material is one reading of the files.
type material struct {
	cert *tls.Certificate // nil without Files.Cert
	pool *x509.CertPool   // nil without Files.CA: no client auth, or system roots
	raw  [][]byte         // the files' bytes, to tell a change from a touch

	certExpiry, caExpiry time.Time // the leaf's NotAfter, the bundle's earliest
}

// Watcher keeps the TLS material of one identity current. Make one with
// New; its methods are safe for concurrent use.
type Watcher struct {
	name    string
	files   Files
	cur     atomic.Pointer[material]
	metrics *Metrics
	failing *outage.Outage
	logger  klog.Logger
	// Interval is how often Run reads the files whatever the file system
	// says; 0 means DefaultInterval. Set it before Run.
	Interval time.Duration
}

// New reads files, for the TLS identity called name in logs and metrics
// ("agent port", "frontend port", "proxy-server connection"), and returns
// a Watcher of them. The first reading must succeed: a binary does not
// start with TLS material it cannot use. metrics may be nil.
func New(name string, files Files, metrics *Metrics, logger klog.Logger) (*Watcher, error) {
	w := &Watcher{
		name: name, files: files, metrics: metrics, logger: logger,
		failing: outage.New("reload the TLS files of the "+name, nil),
	}
	m, err := read(files)
	if err != nil {
		return nil, err
	}
	w.cur.Store(m)
	w.metrics.observe(name, m)
	return w, nil
}

// Check reads files as New would and returns every problem, each naming
// the flag of its file in flags (the same fields, holding flag names such
// as "--agent-cert"), so that a binary refuses a missing or bad file at
// start-up, before it serves anything.
func Check(files, flags Files) []error {
	var errs []error
	for _, f := range []struct{ flag, path string }{{flags.Cert, files.Cert}, {flags.Key, files.Key}, {flags.CA, files.CA}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.flag, err))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	if files.Cert != "" && files.Key != "" {
		if _, err := read(Files{Cert: files.Cert, Key: files.Key}); err != nil {
			errs = append(errs, fmt.Errorf("%s and %s: %w", flags.Cert, flags.Key, err))
		}
	}
	if files.CA != "" {
		if _, err := read(Files{CA: files.CA}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flags.CA, err))
		}
	}
	return errs
}

// read reads and checks the files.
func read(f Files) (*material, error) {
	m := &material{}
	if f.Cert != "" || f.Key != "" {
		certPEM, err1 := os.ReadFile(f.Cert)
		keyPEM, err2 := os.ReadFile(f.Key)
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("certificate %s and key %s: %w", f.Cert, f.Key, err)
		}
		m.cert, m.certExpiry = &cert, cert.Leaf.NotAfter
		m.raw = append(m.raw, certPEM, keyPEM)
	}
	if f.CA != "" {
		caPEM, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, err
		}
		m.pool = x509.NewCertPool()
		// Text between blocks is allowed (OpenSSL writes "Bag Attributes"
		// there); a block that does not decode is not, as upstream now
		// has it (#902): pem.Decode passes over it to the next good one,
		// and trusting what is left would trust other than the operator
		// meant. A stretch that Decode consumed with more than the one
		// BEGIN line of its block held one.
		begin := []byte("-----BEGIN")
		for rest := caPEM; ; {
			before := rest
			var block *pem.Block
			block, rest = pem.Decode(rest)
			consumed := before[:len(before)-len(rest)]
			if block == nil {
				consumed = rest
			}
			if n := bytes.Count(consumed, begin); block == nil && n > 0 || n > 1 {
				at := len(caPEM) - len(before) + bytes.Index(consumed, begin)
				return nil, fmt.Errorf("CA bundle %s: a malformed PEM block at byte %d: fix or remove it", f.CA, at)
			}
			if block == nil {
				break
			}
			if block.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("CA bundle %s: %w", f.CA, err)
			}
			m.pool.AddCert(c)
			if m.caExpiry.IsZero() || c.NotAfter.Before(m.caExpiry) {
				m.caExpiry = c.NotAfter
			}
		}
		if m.caExpiry.IsZero() {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", f.CA)
		}
		m.raw = append(m.raw, caPEM)
	}
	return m, nil
}

// Reload reads the files now. Material that reads and checks well
// replaces the current one; otherwise the current one stays and the
// error is returned (and logged and counted).
func (w *Watcher) Reload() error {
	m, err := read(w.files)
	if err != nil {
		w.failing.Failed(w.logger, err, "files", w.files)
		w.metrics.reloaded(w.name, "error")
		return err
	}
	w.failing.Recovered(w.logger, "files", w.files)
	old := w.cur.Load()
	if slices.EqualFunc(old.raw, m.raw, bytes.Equal) {
		return nil
	}
	w.cur.Store(m)
	w.metrics.observe(w.name, m)
	w.metrics.reloaded(w.name, "ok")
	w.logger.Info("Reloaded TLS files; new handshakes use them", "identity", w.name, "files", w.files,
		"certificateNotAfter", m.certExpiry, "caNotAfter", m.caExpiry)
	return nil
}

// Run reloads the files when their directories change, and every
// Interval, until ctx ends. Without file events (fsnotify unavailable)
// it reloads on the interval alone.
func (w *Watcher) Run(ctx context.Context) {
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw, err := fsnotify.NewWatcher(); err != nil {
		w.logger.Error(err, "Cannot watch the TLS files; reading them every interval", "identity", w.name, "interval", interval)
	} else {
		defer fw.Close()
		for _, dir := range w.dirs() {
			if err := fw.Add(dir); err != nil {
				w.logger.Error(err, "Cannot watch a TLS file's directory; reading it every interval", "identity", w.name, "dir", dir, "interval", interval)
			}
		}
		events, errs = fw.Events, fw.Errors
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	settled := time.NewTimer(settle)
	settled.Stop()
	defer settled.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
			settled.Reset(settle)
		case err := <-errs:
			// An overflow loses events: read now rather than wait.
			w.logger.V(2).Info("File events lost; reading the TLS files", "identity", w.name, "err", err)
			settled.Reset(settle)
		case <-settled.C:
			_ = w.Reload()
		case <-tick.C:
			_ = w.Reload()
		}
	}
}

// dirs are the directories of the files: a Secret volume replaces a
// file by swapping a symlink beside it, which only the directory sees.
func (w *Watcher) dirs() []string {
	var dirs []string
	for _, f := range []string{w.files.Cert, w.files.Key, w.files.CA} {
		if f != "" {
			if d := filepath.Dir(f); !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// ServerConfig returns a server's TLS configuration: the current
// certificate at each handshake and, with a CA bundle, a client
// certificate required and checked against the current bundle.
func (w *Watcher) ServerConfig() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := w.cur.Load().cert; c != nil {
				return c, nil
			}
			return nil, fmt.Errorf("no certificate for the %s", w.name)
		},
	}
	if w.files.CA != "" {
		// Go checks ClientCAs as it was when the listener was made; the
		// bundle of the moment is checked below instead, as Go would.
		cfg.ClientAuth = tls.RequireAnyClientCert
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return w.verify(cs, "", x509.ExtKeyUsageClientAuth)
		}
	}
	return cfg
}

// ClientConfig returns a client's TLS configuration for serverName: the
// current certificate, if any, when the server asks for one, and the
// server's chain and name checked against the current CA bundle (the
// system's roots without one).
func (w *Watcher) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		ServerName: serverName,
		MinVersion: tls.VersionTLS12,
		// Go would check the chain against RootCAs as it was when the
		// configuration was made; VerifyConnection checks it against the
		// bundle of the moment, with the same checks (chain, name, usage).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return w.verify(cs, cs.ServerName, x509.ExtKeyUsageServerAuth)
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := w.cur.Load().cert; c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
	}
}

// verify checks the peer's chain against the current CA bundle.
func (w *Watcher) verify(cs tls.ConnectionState, name string, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the peer sent no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         w.cur.Load().pool,
		DNSName:       name,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{usage},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(opts)
	return err
}

// Metrics are the TLS file metrics of one binary, for every Watcher it
// has.
type Metrics struct {
	expiry  *prometheus.GaugeVec
	reloads *prometheus.CounterVec
}

// NewMetrics returns the metrics named <namespace>_<subsystem>_..., to be
// registered by the caller.
func NewMetrics(namespace, subsystem string) *Metrics {
	return &Metrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "certificate_expiry_timestamp_seconds",
			Help: "When the TLS certificate in use expires (its NotAfter, in Unix seconds), by identity and kind: leaf, or ca (the earliest in the bundle).",
		}, []string{"identity", "kind"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "certificate_reloads_total",
			Help: "Readings of changed TLS files, by identity and result: ok (new handshakes use them), error (the last good ones stay in use).",
		}, []string{"identity", "result"}),
	}
}

// Collectors are the metrics' collectors, to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.expiry, m.reloads}
}

// observe records the expiry of the material now in use by name.
func (m *Metrics) observe(name string, mat *material) {
	if m == nil {
		return
	}
	// Both series exist from the start, so that rate() sees the first.
	m.reloads.WithLabelValues(name, "ok").Add(0)
	m.reloads.WithLabelValues(name, "error").Add(0)
	if !mat.certExpiry.IsZero() {
		m.expiry.WithLabelValues(name, "leaf").Set(float64(mat.certExpiry.Unix()))
	}
	if !mat.caExpiry.IsZero() {
		m.expiry.WithLabelValues(name, "ca").Set(float64(mat.caExpiry.Unix()))
	}
}

// reloaded counts a reading of changed files with its result.
func (m *Metrics) reloaded(name, result string) {
	if m != nil {
		m.reloads.WithLabelValues(name, result).Inc()
	}
}
