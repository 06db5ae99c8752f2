package agent

import (
	"net/http"
)

// Health returns a handler for the agent's health endpoints:
//
//   - /healthz: 200 while Run runs, 503 otherwise;
//   - /readyz and /ready: 200 while at least one server is connected,
//     500 otherwise, as upstream's agent answers.
//
// Other paths get 404. Mount it on the health server beside /metrics.
func (cs *ClientSet) Health() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !cs.running.Load() {
			http.Error(w, "agent not running", http.StatusServiceUnavailable)
			return
		}
		writeOK(w)
	})
	ready := func(w http.ResponseWriter, _ *http.Request) {
		if !cs.Ready() {
			http.Error(w, "no proxy-server connected", http.StatusInternalServerError)
			return
		}
		writeOK(w)
	}
	mux.HandleFunc("/readyz", ready)
	mux.HandleFunc("/ready", ready)
	return mux
}

func writeOK(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok")) // a failed write means the prober left
}
