package servercounter

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/servercount/servercount/pkg/clock"
)

// Defaults for the zero values of [Config].
const (
	// DefaultResolvConf is where nameservers, search and ndots are read.
	DefaultResolvConf = "/etc/resolv.conf"
	// DefaultAttempts is how many times a count is tried before it fails.
	DefaultAttempts = 3
	// DefaultMax is the largest count the binaries believe unless told
	// otherwise (--server-count-max): a broken or hostile answer must not
	// make an agent open thousands of connections. Config.Max itself
	// defaults to no bound.
	DefaultMax = 100
)

// Defaults that no caller outside needs to name; the fields' godoc gives
// their values.
const (
	// defaultTimeout is glibc's and Go's wait for one answer.
	defaultTimeout = 5 * time.Second
	// defaultUDPSize avoids IP fragmentation (DNS Flag Day 2020).
	defaultUDPSize        = 1232
	defaultInitialBackoff = 100 * time.Millisecond
	defaultMaxBackoff     = 2 * time.Second
)

// maxCNAMEs bounds how many CNAMEs a count follows, as resolvers do, so that
// a loop ends.
const maxCNAMEs = 8

// RecordType says which records a [DNSServerCounter] counts.
type RecordType int

// Record types.
const (
	// TypeAuto counts SRV records when the name's first label starts with
	// "_" (as in _agent._tcp.proxy), else TypeIP.
	TypeAuto RecordType = iota
	// TypeSRV counts distinct SRV targets.
	TypeSRV
	// TypeA counts distinct IPv4 addresses.
	TypeA
	// TypeAAAA counts distinct IPv6 addresses.
	TypeAAAA
	// TypeIP asks for A and AAAA and counts the larger family: a
	// dual-stack replica has one address of each.
	TypeIP
)

var typeNames = []string{TypeAuto: "auto", TypeSRV: "srv", TypeA: "a", TypeAAAA: "aaaa", TypeIP: "ip"}

// String returns the lower-case name of t, as [ParseRecordType] takes it.
func (t RecordType) String() string {
	if t >= 0 && int(t) < len(typeNames) {
		return typeNames[t]
	}
	return "unknown"
}

// ParseRecordType parses "auto", "srv", "a", "aaaa" or "ip", in any case.
func ParseRecordType(s string) (RecordType, error) {
	for t, n := range typeNames {
		if strings.EqualFold(s, n) {
			return RecordType(t), nil
		}
	}
	return 0, fmt.Errorf("servercounter: unknown record type %q: use one of auto, srv, a, aaaa, ip", s)
}

// DNSTypes returns the DNS types a count of t asks for; TypeAuto and TypeIP
// ask for A and AAAA.
func (t RecordType) DNSTypes() []uint16 {
	switch t {
	case TypeSRV:
		return []uint16{dns.TypeSRV}
	case TypeA:
		return []uint16{dns.TypeA}
	case TypeAAAA:
		return []uint16{dns.TypeAAAA}
	}
	return []uint16{dns.TypeA, dns.TypeAAAA}
}

// Config configures a [DNSServerCounter]. The zero value of each field but
// Name means its default.
type Config struct {
	// Name is the DNS name of the servers' headless Service, for example
	// proxy-server.kube-system.svc.cluster.local, or
	// _agent._tcp.proxy-server.kube-system.svc.cluster.local for its SRV
	// records. A name without a trailing dot is tried with the search
	// suffixes of ResolvConf, as a pod's resolver would; a trailing dot means
	// the name as it is.
	Name string
	// Type is the record type to count; default TypeAuto.
	Type RecordType
	// Servers lists the nameservers as host:port (the port defaults to 53).
	// Empty means the nameservers of ResolvConf.
	Servers []string
	// ResolvConf is the resolv.conf file whose nameservers, search list and
	// ndots apply; default DefaultResolvConf. It is read once, by
	// NewDNSServerCounter. When Servers is set and the default file does not
	// exist, names are not searched.
	ResolvConf string
	// Timeout is how long a try waits for its answer before the next try
	// starts; the earlier try keeps listening, so a late answer counts.
	// Default 5s, as glibc's and Go's resolvers.
	Timeout time.Duration
	// Attempts is how many times a count is tried, each time against the
	// next nameserver, with exponential back-off between tries; default
	// DefaultAttempts. The context given to Count bounds them all.
	Attempts int
	// TCP sends queries over TCP only.
	TCP bool
	// UDPSize is the EDNS0 buffer size advertised over UDP; default
	// 1232, the size that avoids IP fragmentation.
	UDPSize uint16
	// Min and Max clamp the count when they are above zero, so that a
	// broken or hostile answer with 100000 records does not make a caller
	// open 100000 connections. Found in the Result keeps the number before
	// the clamp.
	Min, Max int
	// InitialBackoff is the wait before the first retry and MaxBackoff
	// bounds later ones; defaults 100ms and 2s. Each wait is randomised
	// by ±50%.
	InitialBackoff, MaxBackoff time.Duration
	// Clock times the per-query timeout and the back-off; nil means the
	// real clock. A deadline of the context given to Count is real time.
	Clock clock.Clock
}

// resolved is a Config with every default applied and resolv.conf read.
type resolved struct {
	Config
	names   []string // candidate FQDNs, in the order they are tried
	servers []string // host:port
}

// withDefaults returns cfg with the default of every zero field applied.
func (cfg Config) withDefaults() Config {
	cfg.ResolvConf = cmp.Or(cfg.ResolvConf, DefaultResolvConf)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.Attempts = cmp.Or(cfg.Attempts, DefaultAttempts)
	cfg.UDPSize = cmp.Or(cfg.UDPSize, defaultUDPSize)
	cfg.InitialBackoff = cmp.Or(cfg.InitialBackoff, defaultInitialBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, defaultMaxBackoff)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Type == TypeAuto {
		cfg.Type = TypeIP
		if strings.HasPrefix(cfg.Name, "_") {
			cfg.Type = TypeSRV
		}
	}
	return cfg
}

// ConfigError is a problem with one field of a [Config]. Validate and
// NewDNSServerCounter return every problem at once, joined
// ([errors.Join]), so that a program with flags can name the flag of
// each instead of the field.
type ConfigError struct {
	// Field is the name of the Config field: "Name", "Servers", "Type",
	// "Timeout", "Attempts", "UDPSize", "Min", "Max", "InitialBackoff" or
	// "MaxBackoff".
	Field string
	// Value is the field's value as given (one entry of Servers), quoted
	// when it is a string.
	Value string
	// Reason says what is wrong and what to give instead.
	Reason string
}

// Error names the field by what it is: "servercounter: invalid name
// "a..b": not a DNS name; use one like ...".
func (e *ConfigError) Error() string {
	return fmt.Sprintf("servercounter: invalid %s %s: %s", fieldNouns[e.Field], e.Value, e.Reason)
}

var fieldNouns = map[string]string{
	"Name": "name", "Servers": "nameserver", "Type": "record type", "Timeout": "timeout", "Attempts": "attempts",
	"UDPSize": "UDP size", "Min": "minimum count", "Max": "maximum count", "InitialBackoff": "initial back-off",
	"MaxBackoff": "maximum back-off",
}

// Validate returns every problem with cfg as NewDNSServerCounter would
// find them, short of reading ResolvConf: each a *[ConfigError], joined.
// A zero field means its default and is valid.
func (cfg Config) Validate() error {
	c := cfg.withDefaults()
	var errs []error
	bad := func(field string, value any, reason string, args ...any) {
		v := fmt.Sprint(value)
		if s, ok := value.(string); ok {
			v = strconv.Quote(s)
		}
		errs = append(errs, &ConfigError{Field: field, Value: v, Reason: fmt.Sprintf(reason, args...)})
	}
	if c.Name == "" {
		bad("Name", c.Name, "no name to count; set it to the servers' headless Service, e.g. proxy-server.kube-system.svc.cluster.local")
	} else if _, ok := dns.IsDomainName(c.Name); !ok || strings.HasPrefix(c.Name, ".") || strings.Contains(c.Name, "..") {
		bad("Name", c.Name, "not a DNS name; use one like proxy-server.kube-system.svc.cluster.local")
	}
	if c.Type < TypeAuto || c.Type > TypeIP {
		bad("Type", int(c.Type), "use TypeAuto, TypeSRV, TypeA, TypeAAAA or TypeIP")
	}
	if c.Timeout < 0 {
		bad("Timeout", c.Timeout, "must be positive")
	}
	if c.Attempts < 0 {
		bad("Attempts", c.Attempts, "must be at least 1")
	}
	if c.UDPSize < dns.MinMsgSize {
		bad("UDPSize", c.UDPSize, "must be at least %d", dns.MinMsgSize)
	}
	switch {
	case c.Min < 0:
		bad("Min", c.Min, "must not be negative (0 means no bound)")
	case c.Max < 0:
		bad("Max", c.Max, "must not be negative (0 means no bound)")
	case c.Max > 0 && c.Min > c.Max:
		bad("Max", c.Max, "below the minimum count %d: want Min <= Max (0 means no bound)", c.Min)
	}
	if c.InitialBackoff < 0 {
		bad("InitialBackoff", c.InitialBackoff, "must be positive")
	} else if c.MaxBackoff < c.InitialBackoff {
		bad("MaxBackoff", c.MaxBackoff, "below the initial back-off %v", c.InitialBackoff)
	}
	for _, s := range c.Servers {
		if _, err := hostPort(s, "53"); err != nil {
			bad("Servers", s, "want host:port or host, e.g. 10.96.0.10:53")
		}
	}
	return errors.Join(errs...)
}

// resolve applies defaults, validates and reads resolv.conf, returning
// every problem at once.
func (cfg Config) resolve() (*resolved, error) {
	r := &resolved{Config: cfg.withDefaults()}
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, s := range r.Servers {
		if hp, err := hostPort(s, "53"); err == nil {
			r.servers = append(r.servers, hp)
		}
	}

	conf, err := dns.ClientConfigFromFile(r.ResolvConf)
	switch {
	case err == nil:
		if len(r.Servers) == 0 {
			for _, s := range conf.Servers {
				r.servers = append(r.servers, net.JoinHostPort(s, conf.Port))
			}
		}
	case errors.Is(err, fs.ErrNotExist) && len(r.Servers) > 0 && cfg.ResolvConf == "":
		conf = &dns.ClientConfig{Ndots: 1}
	default:
		errs = append(errs, fmt.Errorf("servercounter: read resolv.conf: %w", err))
		conf = &dns.ClientConfig{Ndots: 1}
	}
	if len(r.servers) == 0 && len(errs) == 0 {
		errs = append(errs, errNoNameservers)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r.names = searchList(conf, r.Name)
	return r, nil
}

// searchList returns the candidate FQDNs of name, lower-cased, in the
// order they are asked: as a stub resolver walks its search list
// (miekg/dns's NameList: a name with fewer dots than ndots is tried with
// each search suffix first), but for a name that already ends in one of
// the search domains, which is asked as it is first. In a pod
// (ndots:5, search <ns>.svc.cluster.local svc.cluster.local
// cluster.local) the documented form,
// proxy-server.kube-system.svc.cluster.local, has 4 dots: a resolver
// asks three names that cannot exist before it, 8 queries for A and AAAA
// where 2 answer. A name that ends in a search domain is qualified
// already; appending a search domain to it again is what nobody means.
func searchList(conf *dns.ClientConfig, name string) []string {
	names := conf.NameList(name)
	for i, n := range names {
		names[i] = strings.ToLower(n)
	}
	if dns.IsFqdn(name) {
		return names
	}
	lower := strings.ToLower(name)
	for _, domain := range conf.Search {
		domain = strings.ToLower(strings.TrimSuffix(domain, "."))
		if domain != "" && strings.HasSuffix(lower, "."+domain) {
			abs := dns.Fqdn(lower)
			return append([]string{abs}, slices.DeleteFunc(names, func(n string) bool { return n == abs })...)
		}
	}
	return names
}

// hostPort returns s as host:port, adding port when s has none. It takes
// "10.0.0.10", "10.0.0.10:53", "::1", "[::1]:53" and "localhost:5353".
func hostPort(s, port string) (string, error) {
	if host, p, err := net.SplitHostPort(s); err == nil {
		if _, perr := strconv.ParseUint(p, 10, 16); host == "" || perr != nil {
			return "", errBadNameserver
		}
		return s, nil
	}
	if s == "" || strings.ContainsAny(s, "[]/ ") {
		return "", errBadNameserver
	}
	return net.JoinHostPort(s, port), nil
}

var errBadNameserver = errors.New("not host:port or host")
