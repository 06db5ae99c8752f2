package harness

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/servercount/servercount/internal/kubeclient"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/proctest"
)

// ClusterDomain is the cluster's DNS domain, as CoreDNS serves it.
const ClusterDomain = "cluster.local"

// Config configures a Cluster.
type Config struct {
	// Binaries are the programs to run.
	Binaries Binaries
	// Dir holds data dirs, certificates, kubeconfig and logs; empty means a
	// new temporary directory, removed by Close.
	Dir string
	// DNSTTL is the TTL CoreDNS gives its answers, in seconds (0: 5, the
	// kubernetes plugin's default).
	DNSTTL int
	// StartTimeout bounds the start of each component (0: 90s).
	StartTimeout time.Duration
}

// Cluster is etcd, kube-apiserver and CoreDNS on 127.0.0.1, with an admin
// token in system:masters.
type Cluster struct {
	// Dir holds everything the cluster writes.
	Dir string
	// EtcdURL is etcd's client URL.
	EtcdURL string
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string
	// AdminToken is a bearer token of a member of system:masters.
	AdminToken string
	// Kubeconfig is a kubeconfig file for AdminToken.
	Kubeconfig string
	// REST is the client configuration for AdminToken.
	REST *rest.Config
	// Client is a clientset for AdminToken.
	Client kubernetes.Interface
	// Dynamic is a dynamic client for AdminToken.
	Dynamic dynamic.Interface
	// DNS is CoreDNS.
	DNS *CoreDNS

	removeDir bool
	etcd      *Process
	apiserver *Process
	// apiserverBin and apiserverArgs start kube-apiserver again after
	// PauseAPIServer; startTimeout bounds that start.
	apiserverBin  string
	apiserverArgs []string
	startTimeout  time.Duration
}

// StartCluster starts etcd, kube-apiserver and CoreDNS and waits until each
// is ready. On error it stops what it started.
func StartCluster(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 90 * time.Second
	}
	c := &Cluster{Dir: cfg.Dir}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "servercount-e2e-"); err != nil {
			return nil, fmt.Errorf("create the cluster's directory: %w", err)
		}
		c.removeDir = true
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.startEtcd(cfg); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx, cfg); err != nil {
		return nil, err
	}
	port, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return nil, err
	}
	c.DNS = &CoreDNS{
		Addr: "127.0.0.1:" + strconv.Itoa(port),
		bin:  cfg.Binaries.CoreDNS, dir: filepath.Join(c.Dir, "coredns"), timeout: cfg.StartTimeout,
	}
	if err := os.MkdirAll(c.DNS.dir, 0o755); err != nil {
		return nil, err
	}
	ttl := cfg.DNSTTL
	if ttl == 0 {
		ttl = 5
	}
	healthPort, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return nil, err
	}
	readyPort, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return nil, err
	}
	metricsPort, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return nil, err
	}
	c.DNS.readyURL = fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort)
	c.DNS.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	corefile := fmt.Sprintf(`%s:%d {
    bind 127.0.0.1
    errors
    health 127.0.0.1:%d
    ready 127.0.0.1:%d
    prometheus 127.0.0.1:%d
    kubernetes %s {
        kubeconfig %s
        ttl %d
    }
}
`, ClusterDomain, port, healthPort, readyPort, metricsPort, ClusterDomain, c.Kubeconfig, ttl)
	c.DNS.corefile = filepath.Join(c.DNS.dir, "Corefile")
	if err := os.WriteFile(c.DNS.corefile, []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	if err := c.DNS.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startEtcd(cfg Config) error {
	ports, err := nettest.FreePortsOn("127.0.0.1", 2)
	if err != nil {
		return err
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	c.EtcdURL = client
	c.etcd, err = proctest.StartProcess("etcd", filepath.Join(c.Dir, "etcd.log"), cfg.Binaries.Etcd,
		"--name=e2e", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=e2e="+peer, "--initial-cluster-state=new",
		"--unsafe-no-fsync", "--logger=zap", "--log-level=warn")
	if err != nil {
		return err
	}
	return waitFor(c.etcd, cfg.StartTimeout, "healthy", func() error {
		body, code, err := httpGet(client+"/health", "", nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, `"health":"true"`) {
			return fmt.Errorf("/health: %d %s", code, body)
		}
		return nil
	})
}

func (c *Cluster) startAPIServer(ctx context.Context, cfg Config) error {
	dir := filepath.Join(c.Dir, "kube-apiserver")
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		return err
	}
	saKey, err := writeServiceAccountKey(filepath.Join(dir, "sa.key"))
	if err != nil {
		return err
	}
	c.AdminToken = rand.Text()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.AdminToken+`,e2e-admin,e2e-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	port, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return err
	}
	c.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.apiserverBin, c.startTimeout = cfg.Binaries.KubeAPIServer, cfg.StartTimeout
	c.apiserverArgs = []string{
		"--etcd-servers=" + c.EtcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey, "--service-account-signing-key-file=" + saKey,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		// No endpoint for the kubernetes Service: it may not be loopback.
		"--endpoint-reconciler-type=none",
		"--v=1",
	}
	if err := c.runAPIServer(); err != nil {
		return err
	}
	// The self-signed serving certificate is the API server's own; trust it
	// on loopback.
	c.REST = &rest.Config{
		Host: c.APIServerURL, BearerToken: c.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             100, Burst: 200, Timeout: 30 * time.Second,
	}
	if c.Client, err = kubernetes.NewForConfig(c.REST); err != nil {
		return fmt.Errorf("make a clientset: %w", err)
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.REST); err != nil {
		return fmt.Errorf("make a dynamic client: %w", err)
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := kubeclient.WriteKubeconfig(c.Kubeconfig, c.APIServerURL, c.AdminToken); err != nil {
		return err
	}
	if _, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return fmt.Errorf("the kubeconfig written is invalid: %w", err)
	}
	// Wait for the default namespace and the kubernetes Service, which the
	// API server creates itself and CoreDNS's readiness query needs.
	return waitFor(c.apiserver, cfg.StartTimeout, "serving the kubernetes Service", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.Client.CoreV1().Services("default").Get(cctx, "kubernetes", metav1.GetOptions{})
		return err
	})
}

// runAPIServer starts kube-apiserver with the saved arguments and waits
// for its /readyz.
func (c *Cluster) runAPIServer() error {
	p, err := proctest.StartProcess("kube-apiserver", filepath.Join(c.Dir, "kube-apiserver.log"), c.apiserverBin, c.apiserverArgs...)
	if err != nil {
		return err
	}
	c.apiserver = p
	return waitFor(p, c.startTimeout, "ready", getOK(c.APIServerURL+"/readyz", c.AdminToken, &tls.Config{InsecureSkipVerify: true}))
}

// APIServer is one more kube-apiserver of the cluster, on the same etcd,
// with the same tokens and service-account keys as the first, and flags of
// its own (an egress selector configuration, say).
type APIServer struct {
	// URL is https://127.0.0.1:<port>.
	URL string
	// Client is a clientset for the admin token, through this API server.
	Client kubernetes.Interface
	// REST is the client configuration behind Client.
	REST *rest.Config

	proc *Process
}

// StartAPIServer starts another kube-apiserver named name, with the first
// one's flags and extra, and waits for its /readyz. Stop it with Stop.
func (c *Cluster) StartAPIServer(name string, extra ...string) (*APIServer, error) {
	dir := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		return nil, err
	}
	port, err := nettest.FreeTCPUDPPortOn("127.0.0.1")
	if err != nil {
		return nil, err
	}
	var args []string
	for _, a := range c.apiserverArgs {
		switch {
		case strings.HasPrefix(a, "--secure-port="):
			a = "--secure-port=" + strconv.Itoa(port)
		case strings.HasPrefix(a, "--cert-dir="):
			a = "--cert-dir=" + filepath.Join(dir, "certs")
		}
		args = append(args, a)
	}
	a := &APIServer{URL: fmt.Sprintf("https://127.0.0.1:%d", port)}
	if a.proc, err = proctest.StartProcess(name, filepath.Join(c.Dir, name+".log"), c.apiserverBin, append(args, extra...)...); err != nil {
		return nil, err
	}
	if err := waitFor(a.proc, c.startTimeout, "ready", getOK(a.URL+"/readyz", c.AdminToken, &tls.Config{InsecureSkipVerify: true})); err != nil {
		a.proc.Stop()
		return nil, err
	}
	a.REST = rest.CopyConfig(c.REST)
	a.REST.Host = a.URL
	if a.Client, err = kubernetes.NewForConfig(a.REST); err != nil {
		a.proc.Stop()
		return nil, fmt.Errorf("make a clientset for %s: %w", name, err)
	}
	return a, nil
}

// Stop stops the API server.
func (a *APIServer) Stop() { a.proc.Stop() }

// Log returns the last max bytes of the API server's log.
func (a *APIServer) Log(max int) string { return a.proc.Log(max) }

// PauseAPIServer stops kube-apiserver, waits d, and starts it again on
// the same port with the same data, certificates and tokens: clients see
// an outage, then the same API server.
func (c *Cluster) PauseAPIServer(d time.Duration) error {
	c.apiserver.Stop()
	time.Sleep(d) // the outage itself, not a wait for a condition
	return c.runAPIServer()
}

// APIServerMetrics reads kube-apiserver's own /metrics with the admin
// identity, e.g. apiserver_request_total, to count the requests a test
// caused from the server's side.
func (c *Cluster) APIServerMetrics(ctx context.Context) (Metrics, error) {
	body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read kube-apiserver's /metrics: %w", err)
	}
	return proctest.Parse(bytes.NewReader(body))
}

// Close stops CoreDNS, kube-apiserver and etcd, and removes the directory
// if the cluster created it.
func (c *Cluster) Close() {
	if c.DNS != nil {
		c.DNS.Stop()
	}
	if c.apiserver != nil {
		c.apiserver.Stop()
	}
	if c.etcd != nil {
		c.etcd.Stop()
	}
	if c.removeDir {
		os.RemoveAll(c.Dir)
	}
}

// Logs returns the tail of each component's log, for a failure report.
func (c *Cluster) Logs(max int) string {
	var b strings.Builder
	for _, p := range []*Process{c.etcd, c.apiserver, c.DNS.process()} {
		if p != nil {
			fmt.Fprintf(&b, "==> %s <==\n%s\n", p.Name, p.Log(max))
		}
	}
	return b.String()
}

// CoreDNS is a CoreDNS process with the kubernetes plugin, on a fixed
// address across restarts.
type CoreDNS struct {
	// Addr is 127.0.0.1:<port>, UDP and TCP.
	Addr string
	// MetricsURL is CoreDNS's own /metrics (the prometheus plugin):
	// coredns_dns_requests_total counts the queries it received since it
	// last started.
	MetricsURL string

	bin, dir, corefile, readyURL string
	timeout                      time.Duration
	proc                         *Process // nil while stopped; Start and Stop are not concurrent
	starts                       int      // how many times Start ran, for log names
}

func (d *CoreDNS) process() *Process {
	if d == nil {
		return nil
	}
	return d.proc
}

// Start starts CoreDNS on Addr and waits until its kubernetes plugin has
// synced and it answers kubernetes.default.svc.cluster.local.
func (d *CoreDNS) Start() error {
	if d.proc != nil {
		return errors.New("CoreDNS is already running")
	}
	d.starts++
	p, err := proctest.StartProcess("coredns", filepath.Join(d.dir, fmt.Sprintf("coredns-%d.log", d.starts)), d.bin, "-conf", d.corefile)
	if err != nil {
		return err
	}
	d.proc = p
	name := "kubernetes.default.svc." + ClusterDomain + "."
	err = waitFor(p, d.timeout, "ready", func() error {
		if _, code, err := httpGet(d.readyURL, "", nil); err != nil || code != http.StatusOK {
			return fmt.Errorf("/ready: %d %v", code, err)
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		cl := &dns.Client{Timeout: time.Second}
		r, _, err := cl.Exchange(m, d.Addr)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("%s: %s with %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		return nil
	})
	if err != nil {
		d.Stop()
	}
	return err
}

// Stop stops CoreDNS; queries to Addr then go unanswered.
func (d *CoreDNS) Stop() {
	if d.proc != nil {
		d.proc.Stop()
		d.proc = nil
	}
}

// getOK is a check for waitFor: nil once a GET of url (with token, if
// any) answers 200.
func getOK(url, token string, tlsCfg *tls.Config) func() error {
	return func() error {
		body, code, err := httpGet(url, token, tlsCfg)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET %s: %d %.200s", url, code, body)
		}
		return err
	}
}

func httpGet(url, token string, tlsCfg *tls.Config) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return string(b), resp.StatusCode, nil
}

// writeServiceAccountKey writes a new ECDSA P-256 key in PEM, for both
// --service-account-key-file and --service-account-signing-key-file.
func writeServiceAccountKey(path string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", fmt.Errorf("generate the service account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// Requests is how many queries CoreDNS has received since it last
// started (coredns_dns_requests_total, every label), or -1 when its
// metrics cannot be read.
func (d *CoreDNS) Requests() float64 {
	m, err := Scrape(d.MetricsURL)
	if err != nil {
		return -1
	}
	return m.Sum("coredns_dns_requests_total")
}
