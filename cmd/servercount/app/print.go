package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/servercount/servercount/pkg/servercounter"
)

// printer writes results in the format the options ask for.
type printer struct {
	o     *Options
	w     io.Writer
	args  []string
	types servercounter.RecordType
}

func (p *printer) print(res servercounter.Result, err error) {
	switch {
	case p.o.JSON:
		p.printJSON(res, err)
	case p.o.Short:
		if err == nil {
			fmt.Fprintln(p.w, res.Count)
		}
	default:
		p.printDig(res, err)
	}
}

// printDig prints dig-style sections: ";;" lines for people, records in
// zone-file form so they can be pasted into a zone.
func (p *printer) printDig(res servercounter.Result, err error) {
	if err != nil {
		return // Run wrote the error to stderr.
	}
	fmt.Fprintf(p.w, "; <<>> servercount <<>> %s\n", strings.Join(p.args, " "))
	fmt.Fprintln(p.w, ";; QUESTION SECTION:")
	for _, t := range p.types.DNSTypes() {
		fmt.Fprintf(p.w, ";%s\tIN\t%s\n", res.Name, dns.TypeToString[t])
	}
	if len(res.Answer) > 0 {
		fmt.Fprintln(p.w, "\n;; ANSWER SECTION:")
		for _, rr := range res.Answer {
			fmt.Fprintln(p.w, rr.String())
		}
	}
	if len(res.Extra) > 0 {
		fmt.Fprintln(p.w, "\n;; ADDITIONAL SECTION:")
		for _, rr := range res.Extra {
			fmt.Fprintln(p.w, rr.String())
		}
	}
	fmt.Fprintln(p.w)
	fmt.Fprintf(p.w, ";; COUNT: %d%s, outcome: %s, rcode: %s, transport: %s, truncated: %s, min TTL: %s, query time: %s, server: %s\n",
		res.Count, clamped(res), res.Outcome, dns.RcodeToString[res.Rcode], res.Transport, lowerBound(res),
		res.TTL, res.Duration.Round(10*time.Microsecond), res.Server)
	if h := hint(res, p.types); h != "" {
		fmt.Fprintf(p.w, ";; HINT: %s\n", h)
	}
}

// hint explains a zero count in Kubernetes terms, where a zero is most
// often a name that does not match the Service rather than no servers.
func hint(res servercounter.Result, typ servercounter.RecordType) string {
	if res.Count > 0 {
		return ""
	}
	switch {
	case res.Outcome == servercounter.OutcomeNXDomain && typ == servercounter.TypeSRV:
		return "Kubernetes answers NXDOMAIN for an SRV name when the Service has no port of that name " +
			"(_<port name>._<protocol>.<service>.<namespace>.svc.<zone>: the port's name, not its number) " +
			"or no ready endpoint; check the Service's port names and `kubectl get endpointslices`"
	case res.Outcome == servercounter.OutcomeNXDomain:
		return "Kubernetes answers NXDOMAIN for a headless Service with no ready endpoint, and for a Service or " +
			"namespace that does not exist; check `kubectl get endpointslices -l kubernetes.io/service-name=<service>`"
	case res.Outcome == servercounter.OutcomeNoData && typ == servercounter.TypeSRV:
		return "the name exists but has no SRV records: SRV names look like _<port name>._<protocol>.<service>.<namespace>.svc.<zone>"
	case res.Outcome == servercounter.OutcomeNoData:
		return "the name exists but has no addresses of the types asked for; try --type srv or --type ip"
	}
	return ""
}

// printWatch prints one line for a change seen by --watch.
func (p *printer) printWatch(at time.Time, res servercounter.Result, err error) {
	if p.o.JSON {
		p.printJSON(res, err)
		return
	}
	ts := at.UTC().Format(time.RFC3339Nano)
	switch {
	case err != nil:
		fmt.Fprintf(p.w, "%s count=unknown error=%q\n", ts, err.Error())
	case p.o.Short:
		fmt.Fprintf(p.w, "%s %d\n", ts, res.Count)
	default:
		fmt.Fprintf(p.w, "%s count=%d outcome=%s name=%s server=%s ttl=%s\n", ts, res.Count, res.Outcome, res.Name, res.Server, res.TTL)
	}
}

// jsonResult is the JSON form of a count.
type jsonResult struct {
	Name       string   `json:"name"`
	Type       string   `json:"type"`
	Count      *int     `json:"count"`
	Found      int      `json:"found"`
	Outcome    string   `json:"outcome,omitempty"`
	Rcode      string   `json:"rcode,omitempty"`
	Transport  string   `json:"transport,omitempty"`
	Truncated  bool     `json:"truncated"`
	Partial    bool     `json:"partial"`
	TTLSeconds float64  `json:"ttlSeconds"`
	QueryTime  float64  `json:"queryTimeSeconds"`
	Server     string   `json:"server,omitempty"`
	Answer     []string `json:"answer"`
	Extra      []string `json:"extra,omitempty"`
	Hint       string   `json:"hint,omitempty"`
	Error      string   `json:"error,omitempty"`
	ErrorKind  string   `json:"errorKind,omitempty"`
}

func (p *printer) printJSON(res servercounter.Result, err error) {
	j := jsonResult{
		Name:       res.Name,
		Type:       p.types.String(),
		Found:      res.Found,
		Truncated:  res.Truncated,
		Partial:    res.Partial,
		TTLSeconds: res.TTL.Seconds(),
		QueryTime:  res.Duration.Seconds(),
		Server:     res.Server,
		Answer:     []string{},
	}
	if err != nil {
		j.Error = err.Error()
		var de *servercounter.DNSError
		if errors.As(err, &de) {
			j.ErrorKind, j.Name, j.Server = de.Kind.String(), de.Name, de.Server
		}
	} else {
		j.Count = &res.Count
		j.Outcome, j.Rcode, j.Transport = res.Outcome.String(), dns.RcodeToString[res.Rcode], res.Transport.String()
		j.Hint = hint(res, p.types)
	}
	for _, rr := range res.Answer {
		j.Answer = append(j.Answer, rr.String())
	}
	for _, rr := range res.Extra {
		j.Extra = append(j.Extra, rr.String())
	}
	b, _ := json.Marshal(j)
	fmt.Fprintln(p.w, string(b))
}

func clamped(res servercounter.Result) string {
	if res.Found != res.Count {
		return fmt.Sprintf(" (clamped from %d)", res.Found)
	}
	return ""
}

// lowerBound says whether the count may be short of the truth.
func lowerBound(res servercounter.Result) string {
	switch {
	case res.Truncated:
		return "yes (count is a lower bound)"
	case res.Partial:
		return "no, but one address family failed (count is a lower bound)"
	}
	return "no"
}
