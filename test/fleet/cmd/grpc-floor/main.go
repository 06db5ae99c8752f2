// Command grpc-floor is the least a Go agent port can be: grpc-go over
// mutual TLS, with the transport options of servercount's proxy-server
// ([server.GRPCServerOptions]), whose Connect handler answers the
// handshake's headers and then only reads. It routes nothing and has no
// liveness of its own. BenchmarkServerProcess runs it after the real
// servers, with the same agents, to show what of an idle agent stream's
// cost is gRPC's and crypto/tls's, that no server built on them can
// shed.
//
// Its admin port serves what the benchmark samples: /metrics (the Go
// runtime's, and the Connect streams open under upstream's metric name)
// and /debug/pprof/.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

func main() {
	agentPort := flag.Int("agent-port", 0, "the agent port, on 127.0.0.1")
	adminPort := flag.Int("admin-port", 0, "the port of /metrics and /debug/pprof/, on 127.0.0.1")
	cert := flag.String("cert", "", "the server's certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	ca := flag.String("ca", "", "the CA that signs agents' client certificates (PEM)")
	flag.Parse()
	if err := run(*agentPort, *adminPort, *cert, *key, *ca); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-floor:", err)
		os.Exit(1)
	}
}

func run(agentPort, adminPort int, certFile, keyFile, caFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s: no PEM certificate", caFile)
	}
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	gs := grpc.NewServer(append(server.GRPCServerOptions(), grpc.Creds(creds))...)
	wire.RegisterAgentServiceServer(gs, floor{open: promauto.NewGauge(prometheus.GaugeOpts{
		Name:        "konnectivity_network_proxy_server_grpc_connections",
		Help:        "Connect streams open.",
		ConstLabels: prometheus.Labels{"service_method": "Connect"},
	})})

	lis, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(agentPort)))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	admin := &http.Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(adminPort)), Handler: mux}
	errs := make(chan error, 2)
	go func() { errs <- gs.Serve(lis) }()
	go func() { errs <- admin.ListenAndServe() }()
	return <-errs
}

// floor is the Connect handler: the handshake's headers, then reads.
type floor struct{ open prometheus.Gauge }

// Connect answers the agent's handshake as a server of one and reads
// what the agent sends until the stream ends.
func (f floor) Connect(stream wire.AgentConnectServer) error {
	f.open.Inc()
	defer f.open.Dec()
	if err := stream.SendHeader(metadata.Pairs(wire.HeaderServerID, "grpc-floor", wire.HeaderServerCount, "1")); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
}
