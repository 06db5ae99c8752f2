package server

import (
	"sync"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"
)

// Bounds on the level-0 lines of one kind that many peers can cause at
// once (a rejected agent stream, a stream ended for silence, a refused
// TLS handshake): an event that touches 5,000 agents must not become
// 5,000 lines. Metrics count every event.
const (
	logBurst     = 20
	logPerSecond = 2
)

// logLimiter says which lines of a kind to log: at most logBurst at once
// and logPerSecond after, per kind. A line logged after some were left
// out says how many (notLoggedBefore). Its zero value is ready to use.
type logLimiter struct {
	mu   sync.Mutex
	lim  map[string]*rate.Limiter
	left map[string]int
}

// allow reports whether to log a line of kind, and how many of its kind
// were left out since the last one logged.
func (l *logLimiter) allow(kind string) (ok bool, left int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim == nil {
		l.lim, l.left = map[string]*rate.Limiter{}, map[string]int{}
	}
	lim := l.lim[kind]
	if lim == nil {
		lim = rate.NewLimiter(logPerSecond, logBurst)
		l.lim[kind] = lim
	}
	if !lim.Allow() {
		l.left[kind]++
		return false, 0
	}
	left = l.left[kind]
	l.left[kind] = 0
	return true, left
}

// info logs msg with kv at level 0 unless lines of kind are over their
// bound.
func (l *logLimiter) info(log klog.Logger, kind, msg string, kv ...any) {
	if ok, left := l.allow(kind); ok {
		log.Info(msg, withLeft(kv, left)...)
	}
}

// error logs err and msg with kv at the error level unless lines of kind
// are over their bound.
func (l *logLimiter) error(log klog.Logger, kind string, err error, msg string, kv ...any) {
	if ok, left := l.allow(kind); ok {
		log.Error(err, msg, withLeft(kv, left)...)
	}
}

// withLeft adds notLoggedBefore to kv when lines were left out.
func withLeft(kv []any, left int) []any {
	if left > 0 {
		return append(kv, "notLoggedBefore", left)
	}
	return kv
}
