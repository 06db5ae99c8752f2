package agent

import (
	"fmt"
	"net/http"
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
