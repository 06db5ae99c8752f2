// Command grpc-floor is the least a Go proxy-server's gRPC ports can be:
// grpc-go with the transport options of servercount's proxy-server
// ([server.GRPCServerOptions]) and nothing else. It routes nothing.
//
// Its agent port (with --cert) takes agents over mutual TLS: the Connect
// handler answers the handshake's headers and then only reads.
// BenchmarkServerProcess runs it after the real servers, with the same
// agents. With --heartbeat-interval it also takes up an agent's offer of
// heartbeats, and one goroutine sends them once a second, straight from
// that goroutine, to the streams of that second: each stream has its
// second in a round of the interval plus one (6 s at 5 s, the cadence of
// the proxy-server's sweep), so that a second visits only the streams it
// sends to. It is the least a server can do to keep the agents'
// heartbeats going, with no check of what arrives. BenchmarkIdleCost
// runs it after the real server to show what heartbeats cost grpc-go
// alone.
//
// Its admin port serves what the benchmarks sample: /metrics (the Go
// runtime's, the streams open, under upstream's metric name and
// service_method label, and the HEARTBEATs sent and received, under the
// proxy-server's) and /debug/pprof/.
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
	"sync"
	"time"

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
	heartbeat := flag.Duration("heartbeat-interval", 0, "send agents a HEARTBEAT after this long with nothing sent; 0 for none")
	flag.Parse()
	if err := run(*agentPort, *adminPort, *cert, *key, *ca, *uds, *heartbeat); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-floor:", err)
		os.Exit(1)
	}
}

func run(agentPort, adminPort int, certFile, keyFile, caFile, uds string, heartbeat time.Duration) error {
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
		packets := promauto.NewCounterVec(prometheus.CounterOpts{
			Name: "konnectivity_network_proxy_server_stream_packets_total",
			Help: "HEARTBEAT packets, by segment (from_agent or to_agent) and packet_type.",
		}, []string{"segment", "packet_type"})
		f := &agentFloor{
			open:      open.WithLabelValues("Connect"),
			heartbeat: heartbeat,
			in:        packets.WithLabelValues("from_agent", "HEARTBEAT"),
			out:       packets.WithLabelValues("to_agent", "HEARTBEAT"),
		}
		if heartbeat > 0 {
			f.seconds = make([]map[wire.AgentConnectServer]struct{}, int(heartbeat/time.Second)+1)
			for i := range f.seconds {
				f.seconds[i] = map[wire.AgentConnectServer]struct{}{}
			}
			go f.heartbeats()
		}
		wire.RegisterAgentServiceServer(gs, f)
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
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
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
type agentFloor struct {
	open      prometheus.Gauge
	heartbeat time.Duration
	// in and out count the HEARTBEATs received and sent.
	in, out prometheus.Counter

	mu sync.Mutex
	// seconds holds the streams that take heartbeats, each in the second
	// of the round in which it gets its heartbeat; next is the second
	// that comes next.
	seconds []map[wire.AgentConnectServer]struct{}
	next    int
}

// Connect answers the agent's handshake as a server of one and reads
// what the agent sends until the stream ends.
func (f *agentFloor) Connect(stream wire.AgentConnectServer) error {
	f.open.Inc()
	defer f.open.Dec()
	hdr := metadata.Pairs(wire.HeaderServerID, "grpc-floor", wire.HeaderServerCount, "1")
	md, _ := metadata.FromIncomingContext(stream.Context())
	_, offered := wire.ParseHeartbeat(md.Get(wire.HeaderHeartbeat))
	beats := offered && f.heartbeat > 0
	if beats {
		hdr.Set(wire.HeaderHeartbeat, wire.FormatHeartbeat(f.heartbeat))
	}
	if err := stream.SendHeader(hdr); err != nil {
		return err
	}
	if beats {
		f.mu.Lock()
		// The second that comes last: a round after the handshake.
		second := f.seconds[(f.next+len(f.seconds)-1)%len(f.seconds)]
		second[stream] = struct{}{}
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			delete(second, stream)
			f.mu.Unlock()
		}()
	}
	for {
		pkt, err := stream.Recv()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if pkt.GetType() == wire.PacketHeartbeat {
			f.in.Inc()
		}
	}
}

// heartbeats sends, each second, a HEARTBEAT on each stream of that
// second. It alone sends on the streams, after their handlers sent the
// headers, and under mu, so that a handler returns only between its sends.
func (f *agentFloor) heartbeats() {
	for range time.Tick(time.Second) {
		f.mu.Lock()
		for stream := range f.seconds[f.next] {
			_ = stream.Send(wire.Heartbeat()) // a failed stream ends its handler
			f.out.Inc()
		}
		f.next = (f.next + 1) % len(f.seconds)
		f.mu.Unlock()
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
