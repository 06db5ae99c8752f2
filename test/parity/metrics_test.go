package parity

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/servercount/servercount/internal/explain"
	"github.com/servercount/servercount/internal/nettest"
	"github.com/servercount/servercount/test/churn"
)

// upstreamPrefix is the namespace of the metrics both implementations
// export under the same names.
const upstreamPrefix = "konnectivity_network_proxy_"

// family is what a scrape says of one metric: its type and HELP, and for
// each label the values seen.
type family struct {
	typ, help string
	values    map[string][]string
}

// After the same scenario (a dial with no agent, then
// a tunnel and a refused dial, in both frontend modes) the metrics under
// upstream's names match upstream's: the same names, types, HELP, label
// names, and label values seen. Our own metrics live only under
// servercount_.
func TestMetricsAfterTheSameScenario(t *testing.T) {
	up, ours := sides(t)
	p := writePKI(t)
	targets := churn.StartTargets(t)
	scrapes := map[string]map[string]map[string]family{} // side, binary, name
	for _, s := range []side{up, ours} {
		t.Run(s.name, func(t *testing.T) {
			scrapes[s.name] = map[string]map[string]family{"server": {}, "agent": {}}
			for _, mode := range []string{"http-connect", "grpc"} {
				srv := startServer(t, s.server, mode, p, nil)
				waitStatus(t, srv.healthURL+"/healthz", http.StatusOK, srv.Process)
				dial := churn.OverUnix(mode, srv.socket)
				require.Error(t, tryDial(t, dial, targets.Echo), "a dial with no agent")
				a := startAgent(t, s.agent, srv.agentPort, p, nil)
				waitStatus(t, srv.healthURL+"/readyz", http.StatusOK, srv.Process, a.Process)
				roundTrip(t, dial, targets.Echo, "through "+mode)
				require.Error(t, tryDial(t, dial, refusedAddr(t)), "a dial to a refused port")
				merge(scrapes[s.name]["server"], scrape(t, srv.healthURL+"/metrics"))
				merge(scrapes[s.name]["agent"], scrape(t, a.healthURL+"/metrics"))
			}
		})
	}
	if t.Failed() {
		return
	}
	known := differences(t)
	for _, binary := range []string{"server", "agent"} {
		theirs, mine := scrapes["upstream"][binary], scrapes["ours"][binary]
		for _, name := range slices.Sorted(keysOf(theirs, mine)) {
			f, inTheirs := theirs[name]
			m, inMine := mine[name]
			key := binary + " " + name
			switch {
			case !inMine:
				differ(t, known, key, "upstream's metric is missing (upstream's series: %v)", f.values)
				continue
			case !inTheirs:
				differ(t, known, key, "not upstream's: our own metrics belong under servercount_")
				continue
			}
			if f.typ != m.typ {
				differ(t, known, key+" TYPE", "%s, upstream's %s", m.typ, f.typ)
			}
			if f.help != m.help {
				differ(t, known, key+" HELP", "%q, upstream's %q", m.help, f.help)
			}
			for _, label := range slices.Sorted(keysOf(f.values, m.values)) {
				for _, v := range symmetricDifference(f.values[label], m.values[label]) {
					where := "ours"
					if slices.Contains(f.values[label], v) {
						where = "upstream's"
					}
					differ(t, known, fmt.Sprintf("%s %s=%q", key, label, v), "only %s has the series with %s=%q", where, label, v)
				}
			}
		}
	}
}

// tryDial opens a tunnel to addr and makes a round trip, returning the
// first error.
func tryDial(t *testing.T, dial churn.Dialer, addr string) error {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	_, err = c.Read(b)
	return err
}

// refusedAddr is a loopback address where nothing listens.
func refusedAddr(t *testing.T) string {
	return fmt.Sprintf("127.0.0.1:%d", nettest.FreePorts(t, 1)[0])
}

// scrape reads the families under upstreamPrefix at url.
func scrape(t *testing.T, url string) map[string]family {
	t.Helper()
	rsp, err := http.Get(url)
	require.NoError(t, err)
	defer rsp.Body.Close()
	mfs, err := explain.Parse(rsp.Body)
	require.NoError(t, err, "parse %s", url)
	out := map[string]family{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, upstreamPrefix) {
			continue
		}
		f := family{typ: strings.ToLower(mf.GetType().String()), help: mf.GetHelp(), values: map[string][]string{}}
		for _, m := range mf.GetMetric() {
			addLabels(f.values, m.GetLabel())
		}
		out[name] = f
	}
	return out
}

func addLabels(values map[string][]string, labels []*dto.LabelPair) {
	for _, l := range labels {
		if !slices.Contains(values[l.GetName()], l.GetValue()) {
			values[l.GetName()] = append(values[l.GetName()], l.GetValue())
		}
	}
}

// merge adds what src saw to dst.
func merge(dst, src map[string]family) {
	for name, f := range src {
		d, ok := dst[name]
		if !ok {
			dst[name] = f
			continue
		}
		for label, vs := range f.values {
			for _, v := range vs {
				if !slices.Contains(d.values[label], v) {
					d.values[label] = append(d.values[label], v)
				}
			}
		}
	}
}

func keysOf[V any](a, b map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range a {
			if !yield(k) {
				return
			}
		}
		for k := range b {
			if _, dup := a[k]; dup {
				continue
			}
			if !yield(k) {
				return
			}
		}
	}
}

// symmetricDifference returns the values in one of a and b only.
func symmetricDifference(a, b []string) []string {
	var out []string
	for _, v := range a {
		if !slices.Contains(b, v) {
			out = append(out, v)
		}
	}
	for _, v := range b {
		if !slices.Contains(a, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}
