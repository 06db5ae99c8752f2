// Command grpc-floor is the least a Go proxy-server's gRPC ports can be:
// grpc-go with the transport options of servercount's proxy-server
// ([server.GRPCServerOptions]) and nothing else. It routes nothing and
// has no liveness of its own.
//
// Its agent port (with --cert) takes agents over mutual TLS: the Connect
// handler answers the handshake's headers and then only reads.
// BenchmarkServerProcess runs it after the real servers, with the same
// agents. Its frontend (with --frontend-uds) takes gRPC tunnels on a
// Unix socket, as kube-apiserver opens them: the Proxy handler answers a
// DIAL_REQ with a DIAL_RSP, reads, and answers the CLOSE_REQ.
// BenchmarkUpstreamIdleTunnels holds tunnels open through it. Each shows
// what of an idle stream's cost is grpc-go's (and crypto/tls's), which
// no server built on them can shed.
//
// Its admin port serves what the benchmarks sample: /metrics (the Go
// runtime's, and the streams open, under upstream's metric name and
// service_method label) and /debug/pprof/.
package main

import (
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
	"k8s.io/klog/v2"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"

	"github.com/servercount/servercount/internal/tlsfiles"
	"github.com/servercount/servercount/pkg/server"
	"github.com/servercount/servercount/pkg/wire"
)

func main() {
	agentPort := flag.Int("agent-port", 0, "the agent port, on 127.0.0.1")
	adminPort := flag.Int("admin-port", 0, "the port of /metrics and /debug/pprof/, on 127.0.0.1")
	cert := flag.String("cert", "", "the server's certificate (PEM)")
	key := flag.String("key", "", "its key (PEM)")
	ca := flag.String("ca", "", "the CA that signs agents' client certificates (PEM)")
	uds := flag.String("frontend-uds", "", "serve gRPC tunnels on this Unix socket")
	flag.Parse()
	if err := run(*agentPort, *adminPort, *cert, *key, *ca, *uds); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-floor:", err)
		os.Exit(1)
	}
}

func run(agentPort, adminPort int, certFile, keyFile, caFile, uds string) error {
	open := promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "konnectivity_network_proxy_server_grpc_connections",
		Help: "Streams open, by service method.",
	}, []string{"service_method"})
	errs := make(chan error, 3)
	if certFile != "" {
		gs, lis, err := agentPortServer(agentPort, certFile, keyFile, caFile)
		if err != nil {
			return err
		}
		wire.RegisterAgentServiceServer(gs, agentFloor{open: open.WithLabelValues("Connect")})
		go func() { errs <- gs.Serve(lis) }()
	}
	if uds != "" {
		lis, err := net.Listen("unix", uds)
		if err != nil {
			return err
		}
		gs := grpc.NewServer(server.GRPCServerOptions()...)
		client.RegisterProxyServiceServer(gs, frontendFloor{open: open.WithLabelValues("Proxy")})
		go func() { errs <- gs.Serve(lis) }()
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	admin := &http.Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(adminPort)), Handler: mux}
	go func() { errs <- admin.ListenAndServe() }()
	return <-errs
}

// agentPortServer returns the agent port's gRPC server, with mutual TLS
// as the proxy-server sets it up (tlsfiles), and its listener.
func agentPortServer(port int, certFile, keyFile, caFile string) (*grpc.Server, net.Listener, error) {
	w, err := tlsfiles.New("agent port", tlsfiles.Files{Cert: certFile, Key: keyFile, CA: caFile}, nil, klog.Background())
	if err != nil {
		return nil, nil, err
	}
	lis, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, nil, err
	}
	return grpc.NewServer(append(server.GRPCServerOptions(), grpc.Creds(credentials.NewTLS(w.ServerConfig())))...), lis, nil
}

// agentFloor is the Connect handler: the handshake's headers, then reads.
type agentFloor struct{ open prometheus.Gauge }

// Connect answers the agent's handshake as a server of one and reads
// what the agent sends until the stream ends.
func (f agentFloor) Connect(stream wire.AgentConnectServer) error {
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

// frontendFloor is the Proxy handler: each DIAL_REQ answered with a new
// connection, then reads until the CLOSE_REQ, which it answers.
type frontendFloor struct{ open prometheus.Gauge }

// Proxy holds one tunnel (or more, though kube-apiserver's client dials
// one per stream) that leads nowhere.
func (f frontendFloor) Proxy(stream client.ProxyService_ProxyServer) error {
	f.open.Inc()
	defer f.open.Dec()
	var id int64
	for {
		pkt, err := stream.Recv()
		if err != nil {
			return nil // the client went away
		}
		switch pkt.GetType() {
		case client.PacketType_DIAL_REQ:
			id++
			if err := stream.Send(wire.DialRsp(pkt.GetDialRequest().GetRandom(), id, "")); err != nil {
				return err
			}
		case client.PacketType_CLOSE_REQ:
			return stream.Send(wire.CloseRsp(pkt.GetCloseRequest().GetConnectID(), ""))
		}
	}
}
