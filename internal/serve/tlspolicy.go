package serve

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// TLSPolicy is what --cipher-suites and --tls-min-version ask of every
// TLS listener, as upstream's flags mean them.
type TLSPolicy struct {
	// CipherSuites are the TLS 1.0-1.2 suites allowed; nil means Go's
	// defaults. TLS 1.3 suites are not configurable.
	CipherSuites []uint16
	// MinVersion is the lowest version accepted; 0 means TLS 1.2.
	MinVersion uint16
}

// Apply sets p on cfg.
func (p TLSPolicy) Apply(cfg *tls.Config) {
	cfg.CipherSuites = p.CipherSuites
	if p.MinVersion != 0 {
		cfg.MinVersion = p.MinVersion
	}
}

// ParseCipherSuites reads a comma-separated list of IANA cipher suite
// names (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, ...), as upstream's
// --cipher-suites takes them. An empty list means the defaults.
func ParseCipherSuites(s string) ([]uint16, error) {
	if strings.TrimSpace(s) == "" || s == "[]" {
		return nil, nil
	}
	known := map[string]uint16{}
	for _, c := range tls.CipherSuites() {
		known[c.Name] = c.ID
	}
	for _, c := range tls.InsecureCipherSuites() {
		known[c.Name] = c.ID
	}
	var ids []uint16
	for _, name := range strings.Split(strings.Trim(s, "[]"), ",") {
		name = strings.TrimSpace(name)
		id, ok := known[name]
		if !ok {
			return nil, fmt.Errorf("unknown cipher suite %q: use IANA names such as TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", name)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// ParseTLSVersion reads VersionTLS10 ... VersionTLS13, as upstream's
// --tls-min-version takes them; empty means the default, TLS 1.2.
func ParseTLSVersion(s string) (uint16, error) {
	switch s {
	case "":
		return 0, nil
	case "VersionTLS10":
		return tls.VersionTLS10, nil
	case "VersionTLS11":
		return tls.VersionTLS11, nil
	case "VersionTLS12":
		return tls.VersionTLS12, nil
	case "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("unknown TLS version %q: use VersionTLS12 or VersionTLS13 (VersionTLS10 and VersionTLS11 are accepted but unsafe)", s)
}

// CipherSuitesVar defines --cipher-suites on fs, into p, as upstream's: a
// list of names (pflag's type "strings"), comma-separated, and a repeated
// flag adds to the list. A name Go does not know is refused by Parse.
func CipherSuitesVar(fs *pflag.FlagSet, p *[]uint16, name, usage string) {
	fs.Var(&cipherSuitesValue{p: p}, name, usage)
}

// cipherSuitesValue is the pflag.Value of CipherSuitesVar.
type cipherSuitesValue struct {
	p     *[]uint16
	names []string
}

func (v *cipherSuitesValue) Set(s string) error {
	ids, err := ParseCipherSuites(s)
	if err != nil {
		return err
	}
	*v.p = append(*v.p, ids...)
	if ids != nil {
		v.names = append(v.names, s)
	}
	return nil
}

func (v *cipherSuitesValue) String() string { return strings.Join(v.names, ",") }

func (v *cipherSuitesValue) Type() string { return "strings" }
