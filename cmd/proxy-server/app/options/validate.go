package options

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/servercount/servercount/internal/counting"
	"github.com/servercount/servercount/internal/serve"
	"github.com/servercount/servercount/internal/tlsfiles"
)

// Validate returns every problem with o, each naming its flag.
func (o *Options) Validate() []error {
	var errs []error
	if o.ServerID == "" {
		errs = append(errs, errors.New("--server-id must not be empty"))
	}
	if o.ServerCount < 1 {
		errs = append(errs, fmt.Errorf("invalid --server-count %d: must be at least 1", o.ServerCount))
	}
	if o.Mode != ModeGRPC && o.Mode != ModeHTTPConnect {
		errs = append(errs, fmt.Errorf("invalid --mode %q: use grpc or http-connect", o.Mode))
	}
	errs = append(errs, serve.CheckPorts(map[string]int{"--server-port": o.ServerPort, "--agent-port": o.AgentPort, "--health-port": o.HealthPort, "--admin-port": o.AdminPort})...)
	errs = append(errs, o.validateTLS()...)
	errs = append(errs, checkFiles(fileFlag{"--agent-token-file", o.AgentTokenFile}, fileFlag{"--kubeconfig", o.Kube.Kubeconfig})...)
	errs = append(errs, serve.CheckLivenessFlags(o.KeepaliveTime, o.KeepaliveTimeout, o.HeartbeatInterval)...)
	if o.FrontendKeepaliveTime <= 0 {
		errs = append(errs, fmt.Errorf("invalid --frontend-keepalive-time %v: must be positive", o.FrontendKeepaliveTime))
	}
	errs = append(errs, o.DNS.Validate()...)
	errs = append(errs, counting.ValidateMax(o.ServerCountMax)...)
	if (o.AgentNamespace == "") != (o.AgentServiceAccount == "") {
		errs = append(errs, errors.New("--agent-namespace and --agent-service-account go together: set both to check agents' service-account tokens, or neither"))
	}
	if o.AgentNamespace != "" && o.AgentTokenFile != "" {
		errs = append(errs, errors.New("--agent-token-file and --agent-service-account exclude each other: pick one way to check agents' tokens"))
	}
	if o.AgentNamespace == "" && o.AuthenticationAudience != "" {
		errs = append(errs, errors.New("--authentication-audience needs --agent-namespace and --agent-service-account"))
	}
	if o.AgentNamespace == "" && !o.Leases.Enabled && o.Kube.Kubeconfig != "" {
		errs = append(errs, errors.New("--kubeconfig needs --agent-namespace and --agent-service-account, or --enable-lease-controller"))
	}
	errs = append(errs, o.Leases.Validate()...)
	errs = append(errs, serve.CheckStreamFlags(o.StreamStallTimeout, "--frontend-write-timeout", o.FrontendWriteTimeout, o.TunnelWindow)...)
	if o.BindAgentIdentifiers && (o.AgentTokenFile != "" || o.AgentNamespace == "" && o.ClusterCACert == "") {
		errs = append(errs, errors.New("--bind-agent-identifiers needs a credential that proves an agent's node: service-account tokens (--agent-namespace and --agent-service-account) or client certificates (--cluster-ca-cert); a token file proves none"))
	}
	if o.TokenReviewQPS <= 0 || o.TokenReviewBurst < 1 {
		errs = append(errs, fmt.Errorf("invalid --token-review-qps %v or --token-review-burst %d: the rate must be positive and the burst at least 1", o.TokenReviewQPS, o.TokenReviewBurst))
	}
	if o.MaxAgentHandshakesPerAddress < 0 {
		errs = append(errs, fmt.Errorf("invalid --max-agent-handshakes-per-address %d: must not be negative (0: no bound per address)", o.MaxAgentHandshakesPerAddress))
	}
	if o.BackendDialTimeout < 0 || o.UnansweredDialTimeout < 0 || o.GracefulShutdownTimeout < 0 || o.ShutdownDelay < 0 {
		errs = append(errs, errors.New("--backend-dial-timeout, --unanswered-dial-timeout, --graceful-shutdown-timeout and --shutdown-delay-duration must not be negative"))
	}
	return errs
}

// tlsFiles returns the TLS file flags and their values, in --help order.
func (o *Options) tlsFiles() []fileFlag {
	return []fileFlag{
		{"--server-cert", o.ServerCert}, {"--server-key", o.ServerKey}, {"--server-ca-cert", o.ServerCACert},
		{"--cluster-cert", o.ClusterCert}, {"--cluster-key", o.ClusterKey}, {"--cluster-ca-cert", o.ClusterCACert},
	}
}

// fileFlag is a flag that names a file, and its value.
type fileFlag struct{ name, path string }

// validateTLS checks the TLS flags: with --insecure-plaintext none may be
// set (they would be ignored, and a typo in them unnoticed); without it,
// the agent port needs a certificate and key, the frontend port (unless
// on --uds-name) a certificate, key and client CA, each error naming the
// missing flags, and every file given must exist and parse.
func (o *Options) validateTLS() []error {
	var errs []error
	if o.InsecurePlaintext {
		var set []string
		for _, f := range o.tlsFiles() {
			if f.path != "" {
				set = append(set, f.name)
			}
		}
		if len(set) > 0 {
			errs = append(errs, fmt.Errorf("--insecure-plaintext serves without TLS, so %s would be ignored: drop %s or --insecure-plaintext", strings.Join(set, ", "), pronoun(len(set))))
		}
		return errs
	}
	if missing := unset(fileFlag{"--cluster-cert", o.ClusterCert}, fileFlag{"--cluster-key", o.ClusterKey}); missing != "" {
		errs = append(errs, fmt.Errorf("agents need TLS: set %s (or --insecure-plaintext for local use)", missing))
	}
	if o.UDSName == "" {
		if missing := unset(fileFlag{"--server-cert", o.ServerCert}, fileFlag{"--server-key", o.ServerKey}, fileFlag{"--server-ca-cert", o.ServerCACert}); missing != "" {
			errs = append(errs, fmt.Errorf("the frontend port needs mTLS: set %s, or serve it on --uds-name (or --insecure-plaintext for local use)", missing))
		}
	}
	errs = append(errs, tlsfiles.Check(tlsfiles.Files{Cert: o.ServerCert, Key: o.ServerKey, CA: o.ServerCACert},
		tlsfiles.Files{Cert: "--server-cert", Key: "--server-key", CA: "--server-ca-cert"})...)
	return append(errs, tlsfiles.Check(tlsfiles.Files{Cert: o.ClusterCert, Key: o.ClusterKey, CA: o.ClusterCACert},
		tlsfiles.Files{Cert: "--cluster-cert", Key: "--cluster-key", CA: "--cluster-ca-cert"})...)
}

// checkFiles returns an error naming the flag for each file given that
// cannot be found, so that a typo is reported before anything starts.
func checkFiles(fs ...fileFlag) []error {
	var errs []error
	for _, f := range fs {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	return errs
}

// unset returns the names of the flags among fs that are empty, joined
// for a message ("--a and --b"), or "" when all are set.
func unset(fs ...fileFlag) string {
	var names []string
	for _, f := range fs {
		if f.path == "" {
			names = append(names, f.name)
		}
	}
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	default:
		return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
}

func pronoun(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
