package server

import (
	"io"
	"net/http"
)

// Health returns a handler for /healthz (200 "ok" while the process
// serves) and /readyz and /ready (200 "ok" while at least one agent is
// connected, else 500, as upstream's server answers). Other paths get
// 404.
func (s *Server) Health() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok") //nolint:errcheck // nothing to do for a client gone
	})
	ready := func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "no agent connected", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok") //nolint:errcheck // nothing to do for a client gone
	}
	mux.HandleFunc("/readyz", ready)
	mux.HandleFunc("/ready", ready)
	return mux
}
