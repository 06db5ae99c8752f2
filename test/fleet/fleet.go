package fleet

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/servercount/servercount/internal/balancertest"
	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/dnstest"
	"github.com/servercount/servercount/internal/proxytest"
	"github.com/servercount/servercount/internal/tokenreview"
	"github.com/servercount/servercount/pkg/agent"
	"github.com/servercount/servercount/pkg/servercounter"
	"github.com/servercount/servercount/pkg/wire"
)

// Defaults of [Config].
const (
	// DefaultServers is how many proxy-servers New starts and publishes.
	DefaultServers = 3
	// DefaultDNSTTL is the TTL of the headless name's records: CoreDNS's
	// kubernetes plugin answers with 5 s unless told otherwise.
	DefaultDNSTTL = 5 * time.Second
	// DefaultPollInterval is how often the harness reads every agent's
	// connected count while it waits or watches.
	DefaultPollInterval = 5 * time.Millisecond
	// DefaultKubeQPS and DefaultKubeBurst bound each server's TokenReviews
	// (--kubeconfig-qps, --kubeconfig-burst). client-go's own defaults (5
	// and 10) would let a server admit a fleet of 1000 agents only after
	// 200 s; a large cluster raises them, as these do.
	DefaultKubeQPS   = 500
	DefaultKubeBurst = 1000
)

// SRVName is the SRV name of the proxy-servers' headless Service.
const SRVName = "_agent._tcp.proxy-server.kube-system.svc.cluster.local."

// Config configures a [Fleet]. The zero value of each field means its
// default.
type Config struct {
	// Agents is how many agents StartAgents starts. Required.
	Agents int
	// Servers is how many proxy-servers New starts and publishes; default
	// DefaultServers.
	Servers int
	// Mode is where agents dial servers; default agent.DialResolved.
	Mode agent.DialMode
	// DNSTTL is the TTL of the published records, which the agents' caches
	// follow (bounded to [1 s, 30 s] as the binaries bound it); default
	// DefaultDNSTTL.
	DNSTTL time.Duration
	// KubeQPS and KubeBurst bound each server's TokenReview client;
	// defaults DefaultKubeQPS and DefaultKubeBurst.
	KubeQPS   float32
	KubeBurst int
	// PollInterval is how often waits and watches read every agent's
	// count; default DefaultPollInterval.
	PollInterval time.Duration
	// EditAgent, if set, changes each agent's configuration before it
	// starts. Agents otherwise have the binary's defaults (sync 1 s capped
	// at 10 s, hold-down 30 s, probe 1 s).
	EditAgent func(*agent.Config)
}

func (cfg *Config) setDefaults() {
	cfg.Servers = cmp.Or(cfg.Servers, DefaultServers)
	cfg.Mode = cmp.Or(cfg.Mode, agent.DialResolved)
	cfg.DNSTTL = cmp.Or(cfg.DNSTTL, DefaultDNSTTL)
	cfg.KubeQPS = cmp.Or(cfg.KubeQPS, DefaultKubeQPS)
	cfg.KubeBurst = cmp.Or(cfg.KubeBurst, DefaultKubeBurst)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
}

// Fleet is N proxy-agents and M proxy-servers in this process, over
// loopback TLS, with the DNS server that publishes the servers, a random
// load balancer in front of them and a TokenReview endpoint behind them.
// Everything it starts stops when the test ends. Its methods are safe for
// concurrent use, except that StartAgents is called once.
type Fleet struct {
	tb      testing.TB
	cfg     Config
	env     *proxytest.Env
	dns     *dnstest.Server
	lb      *balancertest.Balancer
	reviews *reviewEndpoint
	queries *queryLog

	// connects counts Connect streams opened on every server, streamEnds
	// those that ended; handshakes counts completed TLS handshakes.
	connects, streamEnds, handshakes atomic.Int64

	mu      sync.Mutex // guards servers and nextID
	servers []*proxytest.Server
	nextID  int

	agents []*Agent // set once by New
	// started is how long StartAgents took; written by StartAgents, read
	// after it returns.
	started time.Duration
}

// StartTook returns how long [Fleet.StartAgents] took to start every
// agent: on a loaded machine, the agents started first are converging
// meanwhile, and the last ones start late.
func (f *Fleet) StartTook() time.Duration { return f.started }

// Agent is one agent of a Fleet.
type Agent struct {
	// ID is the agent's ID, "agent-<i>".
	ID  string
	cfg agent.Config
	reg *prometheus.Registry
	// dns are the agent's --server-count-dns flags.
	dns *counting.DNSOptions
	// cache is the agent's DNS counter, as cmd/proxy-agent builds it from
	// dns; set by StartAgents.
	cache atomic.Pointer[servercounter.CachedServerCounter]
	// run is the running agent; set by StartAgents while waits and
	// watches may read it.
	run atomic.Pointer[proxytest.Agent]
}

// Held returns how many servers the agent holds a stream to: 0 before it
// starts.
func (a *Agent) Held() int {
	if r := a.run.Load(); r != nil {
		return r.ClientSet().Connected()
	}
	return 0
}

// Counted returns what the agent's DNS counter answers now: 0 before the
// agent starts and before DNS has answered.
func (a *Agent) Counted() int {
	c := a.cache.Load()
	if c == nil {
		return 0
	}
	// CountServers would wait for the first answer; Count with a context
	// that is already done does not.
	res, err := c.Count(doneContext)
	if err != nil {
		return 0
	}
	return res.Count
}

// doneContext is a context that is already done, so that Count never
// waits. It holds no state anyone can change.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Registry holds the agent's metrics, its DNS counter's included.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// New starts the DNS server, the load balancer, the TokenReview endpoint
// and cfg.Servers proxy-servers, publishes the servers, and prepares
// cfg.Agents agents (certificates, tokens, DNS counters) without starting
// them: see [Fleet.StartAgents].
func New(tb testing.TB, cfg Config) *Fleet {
	tb.Helper()
	cfg.setDefaults()
	require.Positive(tb, cfg.Agents, "fleet.Config.Agents")
	f := &Fleet{tb: tb, cfg: cfg, env: proxytest.NewEnv(tb, "fleet-ca"), dns: dnstest.NewServer(tb)}
	f.queries = newQueryLog()
	f.dns.ObserveQueries(f.queries.add)
	tb.Cleanup(func() { f.dns.ObserveQueries(nil) })
	lb, err := balancertest.New()
	require.NoError(tb, err, "start load balancer")
	tb.Cleanup(func() { _ = lb.Close() }) // the error is the listener's
	f.lb = lb
	f.reviews = startReviewEndpoint(tb)

	var servers []*proxytest.Server
	for range cfg.Servers {
		servers = append(servers, f.StartServer())
	}
	f.Publish(servers...)

	tokens := tb.TempDir()
	f.agents = make([]*Agent, cfg.Agents)
	for i := range f.agents {
		f.agents[i] = f.newAgent(i, tokens)
	}
	return f
}

// newAgent builds agent i as cmd/proxy-agent builds it from
// --server-count-dns, --server-dial-mode, --service-account-token-path and
// its TLS flags: its own client certificate, token file and DNS counter.
func (f *Fleet) newAgent(i int, tokenDir string) *Agent {
	a := &Agent{ID: "agent-" + strconv.Itoa(i), reg: prometheus.NewRegistry()}
	a.dns = counting.NewDNSOptions()
	a.dns.Name, a.dns.Servers = SRVName, []string{f.dns.Addr()}

	token := filepath.Join(tokenDir, a.ID)
	require.NoError(f.tb, os.WriteFile(token, []byte(agentToken(a.ID)), 0o600))

	cfg := agent.DefaultConfig()
	cfg.AgentID = a.ID
	cfg.ServerAddress = f.lb.Addr()
	cfg.TokenPath = token
	cfg.DialMode = f.cfg.Mode
	cfg.TargetPolicy = agent.TargetCounted // set by StartAgents: Counter
	cfg.ServerCountMax = servercounter.DefaultMax
	cfg.Registerer = a.reg
	cfg.DialOptions = []grpc.DialOption{
		// --keepalive-time's and --keepalive-timeout's defaults.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 35 * time.Second, Timeout: 15 * time.Second, PermitWithoutStream: true}),
		grpc.WithTransportCredentials(credentials.NewTLS(f.env.ClientTLS(f.tb, a.ID))),
	}
	if f.cfg.EditAgent != nil {
		f.cfg.EditAgent(&cfg)
	}
	a.cfg = cfg
	return a
}

// StartAgents starts every agent, one after the other as fast as it can,
// and returns when it started the first: the fleet's start. Waits and
// watches may run meanwhile; an agent not yet started holds 0 servers.
func (f *Fleet) StartAgents() time.Time {
	f.tb.Helper()
	start := time.Now()
	defer func() { f.started = time.Since(start) }()
	for _, a := range f.agents {
		// The counter starts with the agent, as in the binary: its first
		// query is part of the cold start.
		cache, err := a.dns.Build(a.reg, "agent", a.dns.Fallback, servercounter.DefaultMax)
		require.NoError(f.tb, err, "build DNS counter of %s", a.ID)
		f.tb.Cleanup(func() { _ = cache.Close() }) // Close does not fail
		a.cache.Store(cache)
		a.cfg.Counter = cache
		a.run.Store(proxytest.StartAgent(f.tb, f.env, a.cfg))
	}
	return start
}

// Agents returns the agents.
func (f *Fleet) Agents() []*Agent { return f.agents }

// StartServer starts one more proxy-server, as cmd/proxy-server wires it
// with --agent-namespace (TokenReviews through a cache), counting its
// Connect streams and TLS handshakes. It is not published: see
// [Fleet.Publish].
func (f *Fleet) StartServer() *proxytest.Server {
	f.tb.Helper()
	f.mu.Lock()
	f.nextID++
	id := "server-" + strconv.Itoa(f.nextID)
	f.mu.Unlock()
	reg := prometheus.NewRegistry()
	auth, err := tokenreview.New(tokenreview.Config{
		Client:    f.reviews.client(f.tb, f.cfg.KubeQPS, f.cfg.KubeBurst),
		Namespace: reviewNamespace, ServiceAccount: reviewServiceAccount,
		Registerer: reg,
	})
	require.NoError(f.tb, err, "create token authenticator of %s", id)
	s := proxytest.StartServer(f.tb, f.env, proxytest.ServerOptions{
		ID:            id,
		Authenticator: auth,
		Registry:      reg,
		EditTLS: func(c *tls.Config) {
			c.VerifyConnection = func(tls.ConnectionState) error {
				f.handshakes.Add(1)
				return nil
			}
		},
		AgentGRPCOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(f.countStreams)},
	})
	f.mu.Lock()
	f.servers = append(f.servers, s)
	f.mu.Unlock()
	return s
}

// countStreams counts the Connect streams a server opens and ends.
func (f *Fleet) countStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != wire.ConnectMethod {
		return handler(srv, ss)
	}
	f.connects.Add(1)
	defer f.streamEnds.Add(1)
	return handler(srv, ss)
}

// Publish makes servers the only ones in DNS (one SRV record each, with
// the fleet's TTL) and behind the load balancertest.
func (f *Fleet) Publish(servers ...*proxytest.Server) {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.AgentAddr()
	}
	f.PublishAddrs(addrs...)
}

// PublishAddrs is Publish for servers known by their agent ports'
// addresses only, such as a proxy-server binary run as a process.
func (f *Fleet) PublishAddrs(addrs ...string) {
	rrs := dnstest.SRVRecords(SRVName, addrs...)
	ttl := uint32(f.cfg.DNSTTL / time.Second)
	for _, rr := range rrs {
		rr.Header().Ttl = ttl
	}
	f.dns.SetRecords(rrs...)
	f.lb.SetBackends(addrs...)
}

// Servers returns every server started, stopped ones included, oldest
// first.
func (f *Fleet) Servers() []*proxytest.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.servers)
}

// Counts are the fleet's counters since it started.
type Counts struct {
	// Connects is the Connect streams the servers opened: every agent
	// dial that got through TLS, duplicates included.
	Connects int64
	// StreamEnds is the Connect streams that ended.
	StreamEnds int64
	// Handshakes is the TLS handshakes the servers completed.
	Handshakes int64
	// DNSQueries is the queries the DNS server received.
	DNSQueries int64
	// TokenReviews is the reviews the TokenReview endpoint answered.
	TokenReviews int64
}

// Sub returns c - o, field by field.
func (c Counts) Sub(o Counts) Counts {
	return Counts{
		Connects:     c.Connects - o.Connects,
		StreamEnds:   c.StreamEnds - o.StreamEnds,
		Handshakes:   c.Handshakes - o.Handshakes,
		DNSQueries:   c.DNSQueries - o.DNSQueries,
		TokenReviews: c.TokenReviews - o.TokenReviews,
	}
}

// String formats c for logs.
func (c Counts) String() string {
	return fmt.Sprintf("connects=%d streamEnds=%d handshakes=%d dnsQueries=%d tokenReviews=%d",
		c.Connects, c.StreamEnds, c.Handshakes, c.DNSQueries, c.TokenReviews)
}

// Counts returns the counters now.
func (f *Fleet) Counts() Counts {
	return Counts{
		Connects:     f.connects.Load(),
		StreamEnds:   f.streamEnds.Load(),
		Handshakes:   f.handshakes.Load(),
		DNSQueries:   int64(f.dns.Queries("")),
		TokenReviews: f.reviews.count.Load(),
	}
}

// QueryTimes returns when each DNS query between from and to arrived,
// oldest first.
func (f *Fleet) QueryTimes(from, to time.Time) []time.Time { return f.queries.between(from, to) }
