package server

import (
	"sync"
	"sync/atomic"
)

// lifecycle is the part of a Server that says whether it serves, drains
// or is closed, and counts what Close and Shutdown wait for: the
// goroutines the Server started, and the tunnels whose last data is
// still on its way. The other parts take it, not the Server, to learn
// that the Server closes.
type lifecycle struct {
	quit chan struct{} // closed by Close: every stream and tunnel ends
	wg   sync.WaitGroup

	// tunnelEnded wakes Shutdown when a tunnel may have ended: a buffer
	// of 1 and a non-blocking send (tunnelMayHaveEnded), so that ends
	// coalesce.
	tunnelEnded chan struct{}
	// pumps counts the flow-controlled tunnels whose pump still delivers
	// the agent's last data: over at the agent, not yet at the frontend.
	pumps atomic.Int64

	// closed is set by Close; no goroutine is added to wg once it is set,
	// but by goroutines that wg counts already (an HTTP CONNECT tunnel's
	// writer, started by serveTunnel, a receive loop or a pump), whose
	// count keeps Close's Wait from returning meanwhile. Guarded by
	// Server.mu.
	closed bool
	// notReady is set by StopReadiness: /readyz fails from then on.
	// shuttingDown is set by Shutdown: new dials and agent streams are
	// refused. Guarded by Server.mu.
	notReady, shuttingDown bool
}

func newLifecycle() *lifecycle {
	return &lifecycle{quit: make(chan struct{}), tunnelEnded: make(chan struct{}, 1)}
}

// stoppingLocked reports whether Shutdown or Close has begun. Called
// with Server.mu held.
func (l *lifecycle) stoppingLocked() bool { return l.closed || l.shuttingDown }

// tunnelMayHaveEnded wakes a waiting Shutdown.
func (l *lifecycle) tunnelMayHaveEnded() {
	select {
	case l.tunnelEnded <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// goStream starts p's receive loop recv. The caller has done l.wg.Add(1)
// under Server.mu, having checked l.closed, so that Close waits for it,
// and through it for p's writer (stopWriter).
func (l *lifecycle) goStream(p *peer, recv func()) {
	go func() {
		defer l.wg.Done()
		defer p.stopWriter()
		recv()
	}()
}
