package fleet

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/servercount/servercount/internal/metricstest"
	"github.com/servercount/servercount/pkg/agent"
)

// side is who a goroutine or an allocation belongs to, from its stack.
type side int

const (
	sideOther side = iota
	sideServer
	sideAgent
)

// serverFrames and agentFrames mark a stack as a proxy-server's or an
// agent's: the first frame, innermost first, that contains one decides.
// gRPC's transports are told apart by their type (http2Server,
// http2Client) or the function that started the goroutine.
var (
	serverFrames = []string{
		"servercount/pkg/server.",
		"servercount/internal/tokenreview.",
		"grpc/internal/transport.(*http2Server)",
		"grpc/internal/transport.NewServerTransport",
		"grpc/internal/transport.newHTTP2Server",
		"google.golang.org/grpc.(*Server)",
		"google.golang.org/grpc.(*serverStream)",
		"(*tlsCreds).ServerHandshake",
		"crypto/tls.(*Conn).serverHandshake",
		"crypto/tls.(*serverHandshakeState",
	}
	agentFrames = []string{
		"servercount/pkg/agent.",
		"servercount/pkg/servercounter.",
		"servercount/internal/counting.",
		"grpc/internal/transport.(*http2Client)",
		"grpc/internal/transport.NewHTTP2Client",
		"grpc/internal/transport.newHTTP2Client",
		"google.golang.org/grpc.(*ClientConn)",
		"google.golang.org/grpc.(*addrConn)",
		"google.golang.org/grpc.(*clientStream)",
		"google.golang.org/grpc.newClientStream",
		"google.golang.org/grpc.NewClient",
		// Only client connections run callback serializers (resolver,
		// balancer and pick-first wrappers): grpc.Server starts none.
		"grpc/internal/grpcsync.(*CallbackSerializer)",
		"(*tlsCreds).ClientHandshake",
		"crypto/tls.(*Conn).clientHandshake",
		"crypto/tls.(*clientHandshakeState",
	}
)

// classify returns whose the stack is.
func classify(stack []uintptr) side {
	frames := runtime.CallersFrames(stack)
	for {
		fr, more := frames.Next()
		for _, m := range serverFrames {
			if strings.Contains(fr.Function, m) {
				return sideServer
			}
		}
		for _, m := range agentFrames {
			if strings.Contains(fr.Function, m) {
				return sideAgent
			}
		}
		if !more {
			return sideOther
		}
	}
}

// heapBySide is the heap in use by allocation stack, from the memory
// profile (complete only with runtime.MemProfileRate = 1).
type heapBySide map[[32]uintptr]int64

func heapProfile() heapBySide {
	// The profile is as of the last completed GC: two make sure that
	// everything freed before now is counted as freed.
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+100)
		var ok bool
		n, ok = runtime.MemProfile(recs, true)
		if ok {
			break
		}
	}
	h := heapBySide{}
	for _, r := range recs[:n] {
		h[r.Stack0] += r.InUseBytes()
	}
	return h
}

// since returns the heap in use that was allocated between old and h,
// per side.
func (h heapBySide) since(old heapBySide) map[side]int64 {
	out := map[side]int64{}
	for k, v := range h {
		d := v - old[k]
		if d == 0 {
			continue
		}
		stack := k[:]
		for i, pc := range k {
			if pc == 0 {
				stack = k[:i]
				break
			}
		}
		out[classify(stack)] += d
	}
	return out
}

// goroutineStacks returns a stack record of every goroutine now.
func goroutineStacks() []runtime.StackRecord {
	n, _ := runtime.GoroutineProfile(nil)
	for {
		recs := make([]runtime.StackRecord, n+100)
		var ok bool
		if n, ok = runtime.GoroutineProfile(recs); ok {
			return recs[:n]
		}
	}
}

// goroutinesBySide counts the goroutines now, per side.
func goroutinesBySide() map[side]int {
	out := map[side]int{}
	for _, r := range goroutineStacks() {
		out[classify(r.Stack())]++
	}
	return out
}

// unattributed returns the innermost function of each goroutine that
// classify cannot attribute, with how many run it, most first.
func unattributed() []string {
	counts := map[string]int{}
	for _, r := range goroutineStacks() {
		if classify(r.Stack()) != sideOther {
			continue
		}
		// The outermost frame names what started the goroutine.
		frames := runtime.CallersFrames(r.Stack())
		var outer string
		for {
			fr, more := frames.Next()
			if fr.Function != "runtime.goexit" {
				outer = fr.Function
			}
			if !more {
				break
			}
		}
		counts[outer]++
	}
	var out []string
	for fn, c := range counts {
		out = append(out, fmt.Sprintf("%6d %s", c, fn))
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// BenchmarkCost measures what an idle fleet costs in this process:
// -fleet.agents agents each holding 3 servers (resolved mode). With every
// allocation profiled (MemProfileRate 1), the heap allocated from the
// servers' start to the fleet's convergence and still in use is split by
// allocation stack into the servers' (pkg/server, gRPC's server transport,
// TLS server handshakes, token reviews) and the agents' (pkg/agent, DNS
// counter, gRPC's client connections, TLS client handshakes); the
// goroutines likewise, by stack. It reports heap bytes and goroutines
// per agent stream on the server side, per agent on the agent side, the
// heap it could not attribute, and the whole HeapInuse growth (after GC)
// per agent.
func BenchmarkCost(b *testing.B) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	f := newBenchFleet(b, agent.DialResolved)
	heap0, inuse0, g0 := heapProfile(), metricstest.HeapInUse(), goroutinesBySide()
	converge(b, f, 3)
	heap, inuse, g := heapProfile().since(heap0), metricstest.HeapInUse(), goroutinesBySide()

	n := float64(len(f.Agents()))
	streams := 3 * n
	b.ReportMetric(float64(heap[sideServer])/streams, "server-heap-B/stream")
	b.ReportMetric(float64(g[sideServer]-g0[sideServer])/streams, "server-goroutines/stream")
	b.ReportMetric(float64(heap[sideAgent])/n, "agent-heap-B/agent")
	b.ReportMetric(float64(g[sideAgent]-g0[sideAgent])/n, "agent-goroutines/agent")
	b.ReportMetric(float64(heap[sideOther])/n, "other-heap-B/agent")
	b.ReportMetric(float64(g[sideOther]-g0[sideOther])/n, "other-goroutines/agent")
	b.ReportMetric((float64(inuse)-float64(inuse0))/n, "heapinuse-B/agent")
	b.ReportMetric(0, "ns/op")
	b.Logf("goroutines not attributed, by the function that runs them:\n%s", strings.Join(unattributed(), "\n"))
}
