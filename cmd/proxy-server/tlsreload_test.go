package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/internal/pkitest"
	"github.com/servercount/servercount/internal/proctest"
	"github.com/servercount/servercount/test/churn"
)

// secretVolume lays TLS files out as a Kubernetes Secret volume does:
// ca.crt, tls.crt and tls.key are symlinks to ..data/<name>, and ..data a
// symlink to the version's directory, swapped atomically by update.
type secretVolume struct {
	t       *testing.T
	dir     string
	version int
}

func newSecretVolume(t *testing.T, ca []*pkitest.CA, leaf *pkitest.Pair) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.update(ca, leaf)
	for _, name := range []string{"ca.crt", "tls.crt", "tls.key"} {
		require.NoError(t, os.Symlink(filepath.Join("..data", name), v.path(name)))
	}
	return v
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// update writes a new version with the bundle of cas and leaf, and swaps
// ..data to it.
func (v *secretVolume) update(cas []*pkitest.CA, leaf *pkitest.Pair) {
	v.version++
	ver := fmt.Sprintf("..v%d", v.version)
	require.NoError(v.t, os.Mkdir(filepath.Join(v.dir, ver), 0o755))
	var bundle []byte
	for _, ca := range cas {
		bundle = append(bundle, ca.PEM...)
	}
	for name, b := range map[string][]byte{"ca.crt": bundle, "tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM} {
		require.NoError(v.t, os.WriteFile(filepath.Join(v.dir, ver, name), b, 0o600))
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	require.NoError(v.t, os.Symlink(ver, tmp))
	require.NoError(v.t, os.Rename(tmp, filepath.Join(v.dir, "..data")))
}

// roundTrip writes a byte through c and reads it back.
func roundTrip(c net.Conn, b byte) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{b}); err != nil {
		return err
	}
	got := make([]byte, 1)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if got[0] != b {
		return fmt.Errorf("echoed %d, want %d", got[0], b)
	}
	return nil
}

// The CA and then the leaf certificates of both binaries rotate
// under a live tunnel, in both frontend modes, as cert-manager does it
// through Secret volumes: the new CA is added beside the old, the leaves
// move to the new CA, the old CA is removed. Nothing restarts, the open
// tunnel keeps working through every step, new tunnels follow each step,
// and an agent whose connection is cut (a balancer restarts) comes back
// with its new certificate, which is the only one the server still takes.
func TestTLSFilesRotateUnderLiveTunnels(t *testing.T) {
	serverBin, agentBin := proctest.Build(t, "cmd/proxy-server"), proctest.Build(t, "cmd/proxy-agent")
	target := nettest.Echo(t)
	for _, mode := range []string{"http-connect", "grpc"} {
		t.Run(mode, func(t *testing.T) {
			oldCA, err := pkitest.NewCA("old")
			require.NoError(t, err)
			newCA, err := pkitest.NewCA("new")
			require.NoError(t, err)
			issue := func(ca *pkitest.CA, server bool, cn string) *pkitest.Pair {
				var p *pkitest.Pair
				var err error
				if server {
					p, err = ca.Server(cn)
				} else {
					p, err = ca.Client(cn)
				}
				require.NoError(t, err)
				return p
			}
			srvVol := newSecretVolume(t, []*pkitest.CA{oldCA}, issue(oldCA, true, "proxy-server"))
			agentVol := newSecretVolume(t, []*pkitest.CA{oldCA}, issue(oldCA, false, "proxy-agent"))

			ports := nettest.FreePorts(t, 6)
			p := func(i int) string { return strconv.Itoa(ports[i]) }
			frontendAddr := "127.0.0.1:" + p(0)
			srv := proctest.Start(t, serverBin, "--mode="+mode,
				"--server-bind-address=127.0.0.1", "--server-port="+p(0),
				"--agent-bind-address=127.0.0.1", "--agent-port="+p(1),
				"--health-bind-address=127.0.0.1", "--health-port="+p(2), "--admin-port="+p(3),
				"--cluster-cert="+srvVol.path("tls.crt"), "--cluster-key="+srvVol.path("tls.key"), "--cluster-ca-cert="+srvVol.path("ca.crt"),
				"--server-cert="+srvVol.path("tls.crt"), "--server-key="+srvVol.path("tls.key"), "--server-ca-cert="+srvVol.path("ca.crt"))
			lb, err := balancertest.New("127.0.0.1:" + p(1))
			require.NoError(t, err)
			defer lb.Close()
			_, lbPort, err := net.SplitHostPort(lb.Addr())
			require.NoError(t, err)
			agent := proctest.Start(t, agentBin, "--proxy-server-host=127.0.0.1", "--proxy-server-port="+lbPort,
				"--ca-cert="+agentVol.path("ca.crt"), "--agent-cert="+agentVol.path("tls.crt"), "--agent-key="+agentVol.path("tls.key"),
				"--health-server-host=127.0.0.1", "--health-server-port="+p(4), "--admin-server-port="+p(5))
			serverMetrics, agentMetrics := "http://127.0.0.1:"+p(2)+"/metrics", "http://127.0.0.1:"+p(4)+"/metrics"
			proctest.RequireStatus(t, "http://127.0.0.1:"+p(2)+"/readyz", http.StatusOK,
				20*time.Second, "the agent never connected:\n%s\n%s", srv.Output(), agent.Output())

			// frontend dials as kube-apiserver does, trusting roots and
			// presenting a client certificate of ca.
			frontend := func(ca *pkitest.CA, roots ...*pkitest.CA) churn.Dialer {
				pool := x509.NewCertPool()
				for _, r := range roots {
					pool.AddCert(r.Cert)
				}
				cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{issue(ca, false, "kube-apiserver").TLS}}
				if mode == "grpc" {
					return churn.GRPCOverTLS(frontendAddr, cfg)
				}
				return churn.ConnectOverTLS(frontendAddr, cfg)
			}
			tunnel := func(d churn.Dialer) error {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				c, err := d(ctx, target)
				if err != nil {
					return err
				}
				defer c.Close()
				return roundTrip(c, 7)
			}
			liveCtx, endLive := context.WithCancel(t.Context())
			defer endLive()
			live, err := frontend(oldCA, oldCA)(liveCtx, target)
			require.NoError(t, err)
			defer live.Close()
			require.NoError(t, roundTrip(live, 1))

			// reloads waits until each binary has taken n new readings of
			// its files: the server both of its identities.
			reloads := func(n float64) {
				t.Helper()
				for _, w := range []struct{ url, metric, identity string }{
					{serverMetrics, "servercount_server_certificate_reloads_total", "cluster"},
					{serverMetrics, "servercount_server_certificate_reloads_total", "server"},
					{agentMetrics, "servercount_agent_certificate_reloads_total", "agent"},
				} {
					require.Eventually(t, func() bool {
						m, err := proctest.Scrape(w.url)
						if err != nil {
							return false
						}
						v, _ := m.Value(w.metric, "identity", w.identity, "result", "ok")
						return v >= n
					}, 20*time.Second, 20*time.Millisecond, "%s: fewer than %g reloads of %s", w.metric, n, w.identity)
				}
			}

			// 1. The new CA beside the old: clients of either are taken.
			srvVol.update([]*pkitest.CA{oldCA, newCA}, issue(oldCA, true, "proxy-server"))
			agentVol.update([]*pkitest.CA{oldCA, newCA}, issue(oldCA, false, "proxy-agent"))
			reloads(1)
			require.NoError(t, roundTrip(live, 2), "the live tunnel after the CA was added")
			require.NoError(t, tunnel(frontend(newCA, oldCA)), "a client of the new CA")
			require.NoError(t, tunnel(frontend(oldCA, oldCA)), "a client of the old CA")

			// 2. The leaves move to the new CA.
			srvVol.update([]*pkitest.CA{oldCA, newCA}, issue(newCA, true, "proxy-server"))
			agentVol.update([]*pkitest.CA{oldCA, newCA}, issue(newCA, false, "proxy-agent"))
			reloads(2)
			require.NoError(t, roundTrip(live, 3), "the live tunnel after the leaves moved")
			require.NoError(t, tunnel(frontend(newCA, newCA)), "the server presents its new leaf")

			// 3. The old CA is removed.
			srvVol.update([]*pkitest.CA{newCA}, issue(newCA, true, "proxy-server"))
			agentVol.update([]*pkitest.CA{newCA}, issue(newCA, false, "proxy-agent"))
			reloads(3)
			require.NoError(t, roundTrip(live, 4), "the live tunnel after the old CA was removed")
			require.Error(t, tunnel(frontend(oldCA, newCA)), "a client of the removed CA was taken")
			require.NoError(t, tunnel(frontend(newCA, newCA)))

			// The agent's connection is cut; it must come back with its
			// new certificate (the server takes no other now) and trust
			// the server's new one.
			lb.Cut()
			require.Eventually(t, func() bool { return tunnel(frontend(newCA, newCA)) == nil },
				30*time.Second, 50*time.Millisecond, "no tunnel after the agent's connection was cut:\n%s", agent.Output())
			m, err := proctest.Scrape(agentMetrics)
			require.NoError(t, err)
			dials, _ := m.Value("servercount_agent_server_dials_total", "result", "ok")
			assert.GreaterOrEqual(t, dials, 2.0, "the agent reconnected")

			for _, proc := range []*proctest.Process{srv, agent} {
				exited, _ := proc.Exited()
				assert.False(t, exited, "%s restarted", proc.Name)
			}
		})
	}
}
