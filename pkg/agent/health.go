package agent

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Health returns a handler for the agent's health endpoints:
//
//   - /healthz: 200 while Run runs, 503 otherwise;
//   - /readyz and /ready: 200 while the agent is ready (see
//     [ClientSet.Ready]), 503 otherwise, as upstream's agent answers: an
//     agent that holds no server is not ready, nor, with
//     Config.ReadyWhenAll, one that has missed a counted server for
//     longer than the grace period. With ?verbose the body is the
//     readiness report: the servers counted, held and being dialled.
//
// Other paths get 404. Mount it on the health server beside /metrics.
func (cs *ClientSet) Health() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !cs.running.Load() {
			http.Error(w, "agent not running", http.StatusServiceUnavailable)
			return
		}
		writeText(w, http.StatusOK, "ok")
	})
	ready := func(w http.ResponseWriter, req *http.Request) {
		r := cs.Readiness()
		code, text := http.StatusOK, "ok"
		switch {
		case r.Held == 0:
			code, text = http.StatusServiceUnavailable, "no proxy-server connected"
		case !r.Ready:
			code, text = http.StatusServiceUnavailable, fmt.Sprintf("serving on %d of %d proxy-servers for %v, longer than --readiness-grace-period %v", len(r.Serving), r.Target, r.MissingFor.Round(time.Second), r.GracePeriod)
		}
		if _, verbose := req.URL.Query()["verbose"]; verbose {
			text = r.report(text)
		}
		writeText(w, code, text)
	}
	mux.HandleFunc("/readyz", ready)
	mux.HandleFunc("/ready", ready)
	return mux
}

// report is the readiness report, ending with verdict.
func (r Readiness) report(verdict string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "counted: %d proxy-servers (%s)\n", r.Target, r.Source)
	fmt.Fprintf(&b, "held: %d, serving on %d: %s\n", r.Held, len(r.Serving), strings.Join(r.Serving, ", "))
	if r.Dialing != "" {
		fmt.Fprintf(&b, "dialing: %s\n", r.Dialing)
	} else {
		b.WriteString("dialing: none\n")
	}
	if r.MissingFor > 0 {
		fmt.Fprintf(&b, "missing: %d for %v\n", r.Target-len(r.Serving), r.MissingFor.Round(time.Millisecond))
	}
	if r.AllServers {
		fmt.Fprintf(&b, "readiness: every counted server, after %v\n", r.GracePeriod)
	} else {
		b.WriteString("readiness: one server (upstream's)\n")
	}
	b.WriteString(verdict)
	return b.String()
}

// writeText answers code with text.
func writeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(text + "\n")) // a failed write means the prober left
}

// Ready reports whether the agent is ready: it holds at least one server
// and, with Config.ReadyWhenAll, it has not served on fewer servers than
// its target for longer than Config.ReadinessGracePeriod.
func (cs *ClientSet) Ready() bool { return cs.Readiness().Ready }

// Readiness is what the agent's readiness is made of, for /readyz's
// report and servercount explain.
type Readiness struct {
	// Ready is what Ready reports.
	Ready bool
	// Target is the number of servers the agent aims for, and Source
	// where that number came from.
	Target int
	Source string
	// Serving are the serverIDs of the servers held that are not going
	// away (no DRAIN, not given up on), sorted; Held counts every server
	// held, those that sent DRAIN included.
	Serving []string
	Held    int
	// Dialing is the addresses of the server dials in flight, sorted and
	// joined with commas, empty when none is.
	Dialing string
	// MissingFor is how long the agent has served on fewer servers than
	// Target, 0 when it serves on them all.
	MissingFor time.Duration
	// AllServers and GracePeriod are Config.ReadyWhenAll and
	// Config.ReadinessGracePeriod.
	AllServers  bool
	GracePeriod time.Duration
}

// noteServing records, for readiness, whether the agent serves on as many
// servers as target at now.
func (cs *ClientSet) noteServing(serving, target int, now time.Time) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	switch {
	case serving >= target:
		cs.missingSince = time.Time{}
	case cs.missingSince.IsZero():
		cs.missingSince = now
	}
}

// readinessGauges returns, for the metrics, whether the agent is ready
// and how long it has served on fewer servers than its target.
func (cs *ClientSet) readinessGauges() (ready bool, missingFor time.Duration) {
	r := cs.Readiness()
	return r.Ready, r.MissingFor
}

// Readiness returns the agent's readiness now.
func (cs *ClientSet) Readiness() Readiness {
	now := cs.now()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	r := Readiness{
		Target: cs.lastTarget, Source: cs.lastSource, Held: cs.heldLocked(), Dialing: cs.dialingListLocked(),
		AllServers: cs.cfg.ReadyWhenAll, GracePeriod: cs.cfg.ReadinessGracePeriod,
	}
	for id, c := range cs.clients {
		if !c.dropped.Load() && !c.serverDraining.Load() {
			r.Serving = append(r.Serving, id)
		}
	}
	slices.Sort(r.Serving)
	if len(r.Serving) < r.Target && !cs.missingSince.IsZero() {
		r.MissingFor = now.Sub(cs.missingSince)
	}
	r.Ready = r.Held > 0
	if r.AllServers && len(r.Serving) < r.Target && r.MissingFor > r.GracePeriod {
		r.Ready = false
	}
	return r
}
