package servercounter

import (
	"context"
	"errors"
	"fmt"

	"github.com/miekg/dns"
)

// errNoNameservers is returned by NewDNSServerCounter when neither
// Config.Servers nor the resolv.conf file names a nameserver.
var errNoNameservers = errors.New("servercounter: no nameservers: list them in Config.Servers or in resolv.conf")

// ErrorKind names why a DNS count failed. Every kind means the count is
// unknown, as opposed to a valid zero.
type ErrorKind int

// Kinds of DNS failure.
const (
	// ErrorTimeout: no answer within the per-query timeout, or the context
	// ended.
	ErrorTimeout ErrorKind = iota + 1
	// ErrorServerFailure: the server answered SERVFAIL, or another error
	// rcode but REFUSED.
	ErrorServerFailure
	// ErrorRefused: the server answered REFUSED; it will not resolve the
	// name for us.
	ErrorRefused
	// ErrorMalformed: the answer did not parse, or did not answer the
	// question asked.
	ErrorMalformed
	// ErrorNetwork: the query could not be sent or its answer not read, for
	// example because the port is closed.
	ErrorNetwork
)

// String returns the lower-case name of k, as used in logs and metrics.
func (k ErrorKind) String() string {
	switch k {
	case ErrorTimeout:
		return "timeout"
	case ErrorServerFailure:
		return "servfail"
	case ErrorRefused:
		return "refused"
	case ErrorMalformed:
		return "malformed"
	case ErrorNetwork:
		return "network"
	}
	return "unknown"
}

// DNSError is the error of a DNS count that failed: the count is unknown.
// It unwraps to the underlying error, so errors.Is(err,
// context.DeadlineExceeded) works.
type DNSError struct {
	// Name is the name whose answer failed.
	Name string
	// Server is the nameserver that failed last.
	Server string
	// Kind says why the count failed.
	Kind ErrorKind
	// Rcode is the response code for ErrorServerFailure and ErrorRefused,
	// else -1.
	Rcode int
	// Attempts is how many times the count was tried.
	Attempts int
	// Err is the underlying error.
	Err error
}

// Error says what failed, where, how often it was tried, and what to try.
func (e *DNSError) Error() string {
	msg := "count servers at " + e.Name + ": "
	hint := ""
	switch e.Kind {
	case ErrorTimeout:
		msg += "timed out"
		hint = "check that the nameserver is reachable, or allow more time"
		if errors.Is(e.Err, context.Canceled) {
			msg, hint = "count servers at "+e.Name+": canceled", ""
		}
	case ErrorServerFailure:
		msg += "server answered " + dns.RcodeToString[e.Rcode]
		hint = "the nameserver could not resolve the name; check its logs and upstreams"
	case ErrorRefused:
		msg += "server answered " + dns.RcodeToString[e.Rcode]
		hint = "the nameserver will not resolve this name; ask the cluster DNS instead"
	case ErrorMalformed:
		msg += "malformed answer"
		hint = "the nameserver's answer is broken; check its configuration"
	default:
		msg += "network error"
		hint = "check the nameserver's address and port"
	}
	if e.Server != "" {
		msg += " from " + e.Server
	}
	if e.Attempts > 1 {
		msg += fmt.Sprintf(" after %d attempts", e.Attempts)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if hint != "" {
		msg += " (" + hint + ")"
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *DNSError) Unwrap() error { return e.Err }
