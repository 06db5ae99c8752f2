// Package explain reads a proxy-agent's or a proxy-server's /metrics and
// says in plain words what it holds, what it aims for and why, and what is
// failing: the question an operator has when an agent holds 2 servers,
// DNS says 3 and the leases say 3. It is `servercount explain URL`.
//
// It works from one scrape: counters are totals since the binary started.
// It knows servercount's metrics and upstream's; of an upstream binary it
// reads what upstream exports.
package explain

import (
	"context"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind is what a scraped binary is.
type Kind string

// The kinds of binary.
const (
	Agent  Kind = "proxy-agent"
	Server Kind = "proxy-server"
)

// Report is what one scrape says.
type Report struct {
	// URL is what was read.
	URL string `json:"url"`
	// Kind is the binary's kind.
	Kind Kind `json:"kind"`
	// Version is servercount's build, empty for an upstream binary.
	Version string `json:"version,omitempty"`
	// Facts are what the binary holds and why, a sentence each.
	Facts []string `json:"facts"`
	// Problems are what is failing, a sentence each; none when healthy.
	Problems []string `json:"problems"`
}

// Healthy reports whether nothing is failing.
func (r *Report) Healthy() bool { return len(r.Problems) == 0 }

// maxBody bounds what is read of a /metrics page.
const maxBody = 16 << 20

// Read scrapes url (its /metrics when it has no path) and explains it. An
// error means there is nothing to explain: the page could not be read, or
// it is not a proxy-agent's or a proxy-server's.
func Read(ctx context.Context, client *http.Client, raw string) (*Report, error) {
	url, err := MetricsURL(raw)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read %s: %s", url, resp.Status)
	}
	m, err := Parse(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	r, err := Explain(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	r.URL = url
	return r, nil
}

// MetricsURL is the /metrics URL of raw: a host:port, or a URL; http://
// when it names no scheme, /metrics when it has no path.
func MetricsURL(raw string) (string, error) {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := neturl.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("invalid URL %q: give the health or admin address of a proxy-agent or proxy-server, e.g. 10.0.0.5:8093 or http://10.0.0.5:8093/metrics", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String(), nil
}

// Metrics are the samples of one scrape.
type Metrics map[string]*dto.MetricFamily

// Parse reads the Prometheus text format.
func Parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("not Prometheus metrics: %w", err)
	}
	return Metrics(fams), nil
}

// has reports whether the family name exists.
func (m Metrics) has(name string) bool { return m[name] != nil }

// value is the sum of name's samples whose labels include labels (name,
// value, ...); ok is false when there is none.
func (m Metrics) value(name string, labels ...string) (v float64, ok bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
	for _, s := range f.Metric {
		if hasLabels(s, labels) {
			v, ok = v+sampleValue(s), true
		}
	}
	return v, ok
}

// byLabel is name's value for each value of label, leaving out zeros.
func (m Metrics) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	if f := m[name]; f != nil {
		for _, s := range f.Metric {
			if v := sampleValue(s); v != 0 {
				out[labelValue(s, label)] += v
			}
		}
	}
	return out
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	}
	return 0
}

func hasLabels(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if labelValue(s, labels[i]) != labels[i+1] {
			return false
		}
	}
	return true
}

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// counts prints a map of counts as "3 timeout, 1 refused", largest first.
func counts(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%g %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// Explain explains one scrape.
func Explain(m Metrics) (*Report, error) {
	r := &Report{Facts: []string{}, Problems: []string{}}
	switch {
	case m.has("konnectivity_network_proxy_agent_open_server_connections"):
		r.Kind = Agent
	case m.has("konnectivity_network_proxy_server_ready_backend_connections"):
		r.Kind = Server
	default:
		return nil, fmt.Errorf("neither a proxy-agent's nor a proxy-server's metrics (no konnectivity_network_proxy_agent_open_server_connections or _server_ready_backend_connections)")
	}
	if f := m["servercount_build_info"]; f != nil && len(f.Metric) > 0 {
		s := f.Metric[0]
		r.Version = fmt.Sprintf("servercount %s (revision %s, %s)", labelValue(s, "version"), labelValue(s, "revision"), labelValue(s, "goversion"))
	}
	if r.Kind == Agent {
		explainAgent(m, r)
	} else {
		explainServer(m, r)
	}
	explainDNS(m, r)
	explainCertificates(m, r, time.Now())
	return r, nil
}

func explainAgent(m Metrics, r *Report) {
	held, _ := m.value("konnectivity_network_proxy_agent_open_server_connections")
	target, _ := m.value("konnectivity_network_proxy_agent_known_server_count")
	source := ""
	for src, v := range m.byLabel("servercount_agent_target_server_count", "source") {
		if v > 0 {
			source = src
		}
	}
	why := map[string]string{
		"dns":      "the DNS count of the proxy-servers' Service (--server-count-dns)",
		"leases":   "the proxy-servers' leases (--count-server-leases)",
		"received": "the serverCount the proxy-servers sent in their handshakes, as upstream agents do",
		"static":   "a static count",
		"fallback": "--fallback-server-count: no count has been learnt yet",
	}[source]
	fact := fmt.Sprintf("Holds %g of the %g proxy-servers it aims for.", held, target)
	if why != "" {
		fact = fmt.Sprintf("Holds %g of the %g proxy-servers it aims for; the target comes from %s.", held, target, why)
	}
	r.Facts = append(r.Facts, fact)
	if held < target {
		missing := fmt.Sprintf("%g proxy-server(s) missing", target-held)
		if d, ok := m.value("servercount_agent_missing_servers_seconds"); ok && d > 0 {
			missing += fmt.Sprintf(" for %s", time.Duration(d*float64(time.Second)).Round(time.Second))
		}
		r.Problems = append(r.Problems, missing+": the agent keeps dialing; requests that kube-apiserver sends through the missing servers fail for this node.")
	}
	if ready, ok := m.value("servercount_agent_ready"); ok && ready == 0 && held > 0 {
		r.Problems = append(r.Problems, "Not ready (/readyz fails): with --readiness-all-servers, a counted proxy-server has been missing for longer than --readiness-grace-period. /readyz?verbose lists what is counted, held and dialled.")
	}
	if dns, ok := m.value("servercount_agent_dns_server_count"); ok && source == "dns" && dns < target {
		r.Facts = append(r.Facts, fmt.Sprintf("DNS now says %g, fewer than the target: a lower count must last --server-count-hold-down before the agent aims for it.", dns))
	}
	if source == "fallback" {
		r.Problems = append(r.Problems, "No server count has been learnt since the agent started; it uses --fallback-server-count and may hold fewer servers than exist.")
	}
	if dials := m.byLabel("servercount_agent_server_dials_total", "result"); len(dials) > 0 {
		r.Facts = append(r.Facts, "Connect dials to proxy-servers since start: "+counts(dials)+".")
		if dials["error"] > 0 && held < target {
			r.Problems = append(r.Problems, fmt.Sprintf("%g Connect dial(s) to proxy-servers failed: the agent's log names the server and the error (refused, TLS, token) at the default level.", dials["error"]))
		}
	}
	if fails := m.byLabel("konnectivity_network_proxy_agent_endpoint_dial_failure_total", "reason"); len(fails) > 0 {
		r.Problems = append(r.Problems, "Dials into the cluster failed since start: "+counts(fails)+".")
	}
	tunnels, _ := m.value("konnectivity_network_proxy_agent_open_endpoint_connections")
	queued, _ := m.value("servercount_agent_queued_bytes")
	r.Facts = append(r.Facts, fmt.Sprintf("%g tunnel(s) open, %g byte(s) queued for endpoints.", tunnels, queued))
	if lists := m.byLabel("konnectivity_network_proxy_agent_lease_lists_total", "http_response_code"); len(lists) > 0 {
		r.Facts = append(r.Facts, "Lease lists since start, by response code: "+counts(lists)+".")
		for code, n := range lists {
			if code != "200" {
				r.Problems = append(r.Problems, fmt.Sprintf("%g lease list(s) answered %s: check the agent's RBAC on leases and its API server.", n, code))
			}
		}
	}
	explainStuck(m, r, "servercount_agent_streams_ended_total")
}

func explainServer(m Metrics, r *Report) {
	agents, _ := m.value("konnectivity_network_proxy_server_ready_backend_connections")
	r.Facts = append(r.Facts, fmt.Sprintf("%g agent stream(s) connected.", agents))
	if agents == 0 {
		r.Problems = append(r.Problems, "No agent is connected: every request kube-apiserver sends through this server fails. Check that agents run, reach this server and count it.")
	}
	if n, ok := m.value("servercount_server_reported_server_count"); ok {
		r.Facts = append(r.Facts, fmt.Sprintf("Tells agents there are %g proxy-servers.", n))
	}
	established, _ := m.value("konnectivity_network_proxy_server_established_connections")
	pending, _ := m.value("konnectivity_network_proxy_server_pending_backend_dials")
	r.Facts = append(r.Facts, fmt.Sprintf("%g tunnel(s) established, %g dial(s) waiting for an agent's answer.", established, pending))
	if fails := m.byLabel("konnectivity_network_proxy_server_dial_failure_count", "reason"); len(fails) > 0 {
		r.Problems = append(r.Problems, "Dials failed since start: "+counts(fails)+".")
	}
	if rej := m.byLabel("servercount_server_agent_rejections_total", "reason"); len(rej) > 0 {
		r.Problems = append(r.Problems, "Agent streams refused at the handshake since start: "+counts(rej)+".")
	}
	if n, _ := m.value("servercount_server_unresponsive_agent_streams"); n > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%g agent stream(s) answer no dials (the agent is stopped, locked up or cut off): their dials go to other agents, and they get new ones only when no other agent can take them.", n))
	}
	if retries := m.byLabel("servercount_server_dial_retries_total", "reason"); len(retries) > 0 {
		r.Facts = append(r.Facts, "Dials sent again to another agent since start: "+counts(retries)+".")
	}
	if waiting, _ := m.value("servercount_server_frontends_waiting_for_agent"); waiting > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("%g frontend(s) wait for room in an agent's queue: an agent that does not read holds them.", waiting))
	}
	explainStuck(m, r, "servercount_server_streams_ended_total")
	if n := m.byLabel("servercount_server_tunnels_ended_total", "reason"); len(n) > 0 {
		r.Problems = append(r.Problems, "Tunnels ended because they were stuck, since start: "+counts(n)+".")
	}
}

func explainStuck(m Metrics, r *Report, name string) {
	if n := m.byLabel(name, "reason"); len(n) > 0 {
		r.Problems = append(r.Problems, "Agent streams ended because they were stuck, since start: "+counts(n)+".")
	}
}

// failedOutcomes are the DNS outcomes that are failures, not answers.
var failedOutcomes = []string{"timeout", "servfail", "refused", "malformed", "network"}

func explainDNS(m Metrics, r *Report) {
	sub := "agent"
	if r.Kind == Server {
		sub = "server"
	}
	lookups := m.byLabel("servercount_"+sub+"_dns_lookups_total", "outcome")
	if len(lookups) == 0 {
		return
	}
	count, _ := m.value("servercount_" + sub + "_dns_server_count")
	age, _ := m.value("servercount_" + sub + "_server_count_age_seconds")
	r.Facts = append(r.Facts, fmt.Sprintf("DNS counts %g proxy-server(s), %s ago; lookups since start: %s.", count, time.Duration(age*float64(time.Second)).Round(time.Second), counts(lookups)))
	var failed float64
	for _, o := range failedOutcomes {
		failed += lookups[o]
	}
	answered := lookups["records"] + lookups["nxdomain"] + lookups["nodata"]
	if wait, _ := m.value("servercount_" + sub + "_dns_backoff_seconds"); wait > 0 {
		next := "soon"
		if at, _ := m.value("servercount_" + sub + "_dns_retry_timestamp_seconds"); at > 0 {
			next = "at " + time.Unix(0, int64(at*1e9)).UTC().Format(time.TimeOnly) + " UTC"
		}
		r.Problems = append(r.Problems, fmt.Sprintf("The last DNS lookup failed: the count backs off, the next lookup %s (waits of up to --server-count-dns-retry-max), and the last good count stays in use.", next))
	}
	if failed > 0 && answered == 0 {
		r.Problems = append(r.Problems, "Every DNS lookup has failed since start: check the --server-count-dns name and the cluster DNS; `servercount <name>` shows what DNS says.")
	}
}

func explainCertificates(m Metrics, r *Report, now time.Time) {
	for _, name := range []string{"servercount_agent_certificate_expiry_timestamp_seconds", "servercount_server_certificate_expiry_timestamp_seconds"} {
		f := m[name]
		if f == nil {
			continue
		}
		for _, s := range f.Metric {
			left := time.Unix(int64(s.GetGauge().GetValue()), 0).Sub(now).Round(time.Minute)
			what := fmt.Sprintf("The %s certificate of %s expires in %s.", labelValue(s, "kind"), labelValue(s, "identity"), left)
			if left < 7*24*time.Hour {
				r.Problems = append(r.Problems, what+" It is taken again when its files change; renew it.")
			} else {
				r.Facts = append(r.Facts, what)
			}
		}
	}
	for _, name := range []string{"servercount_agent_certificate_reloads_total", "servercount_server_certificate_reloads_total"} {
		if n, _ := m.value(name, "result", "error"); n > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%g reading(s) of changed TLS files failed: the last good ones stay in use; the log says why.", n))
		}
	}
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s at %s", r.Kind, r.URL)
	if r.Version != "" {
		fmt.Fprintf(&b, ": %s", r.Version)
	}
	b.WriteString("\n")
	for _, f := range r.Facts {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	if r.Healthy() {
		b.WriteString("Nothing is failing.\n")
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "PROBLEM: %s\n", p)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
