package wire

import (
	"fmt"
	"time"

	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// HeaderHeartbeat announces servercount's heartbeats: the interval, as a
// Go duration ("5s"), after which the sender sends HEARTBEAT on a stream
// on which it has sent nothing else (an agent times its own as below). The agent sends it with its
// handshake; a server that takes it up answers with its own interval in
// the response headers, and only then are heartbeats on for the stream.
// Each end then holds the other to it: a stream on which nothing has
// arrived for [SilenceLimit] of the peer's interval, while its receive
// loop waited for a packet, has a dead peer (a frozen process, a black
// hole, a relay that forwards nothing) and is ended. Upstream ignores the
// header, so either end speaks the plain protocol with an upstream peer
// and relies on HTTP/2 keepalive instead.
//
// Between our halves the agent's heartbeats answer the server's: the
// agent answers a HEARTBEAT at once when it has sent nothing for half its
// interval, and sends one unprompted only after one and a half. The
// server's sweep sends the heartbeats of many idle streams at once, and
// their answers arrive while it is still awake, where each agent's own
// timer would wake it once more: at 5000 idle agents that halves what
// the server spends on heartbeats. An agent still sends something within
// one and a half of its intervals and the period of its checks (at most
// a quarter interval), within the SilenceLimit of them that the server
// waits. The packets are the same, so agents of either timing work with
// either server.
const HeaderHeartbeat = "servercount-heartbeat"

// Bounds of a heartbeat interval, sent or accepted.
const (
	// MinHeartbeat keeps a peer from making us send, or expect, a packet
	// every few microseconds.
	MinHeartbeat = 10 * time.Millisecond
	// MaxHeartbeat is an hour, the HTTP/2 keepalive both upstream
	// binaries default to: a longer one is no liveness check at all.
	MaxHeartbeat = time.Hour
)

// DefaultHeartbeat is the interval both binaries announce by default: a
// dead peer is then found within SilenceLimit x 5 s = 12.5 s, and an idle
// stream costs one small packet each way every 5 or 6 s (the server's
// sweep looks once a second).
const DefaultHeartbeat = 5 * time.Second

// SilenceLimit is how many of the peer's heartbeat intervals may pass
// with nothing received before the peer is taken for dead: one missed
// heartbeat is a late one, two and a half are not.
const SilenceLimit = 2.5

// Silence returns how long a stream may stay silent when the peer
// announced interval: SilenceLimit of it.
func Silence(interval time.Duration) time.Duration {
	return time.Duration(float64(interval) * SilenceLimit)
}

// CheckHeartbeat checks a configured interval: MinHeartbeat to
// MaxHeartbeat, or -1 for no heartbeats. The error starts with d and says
// what is allowed, for the caller to prefix with the setting's name.
func CheckHeartbeat(d time.Duration) error {
	if d == -1 || d >= MinHeartbeat && d <= MaxHeartbeat {
		return nil
	}
	return fmt.Errorf("%v: want %v to %v, or -1 for none", d, MinHeartbeat, MaxHeartbeat)
}

// FormatHeartbeat is the HeaderHeartbeat value for interval d.
func FormatHeartbeat(d time.Duration) string { return d.String() }

// ParseHeartbeat reads a HeaderHeartbeat value; ok is false when there is
// not exactly one value or it is not a duration within the bounds, and
// then heartbeats stay off.
func ParseHeartbeat(values []string) (interval time.Duration, ok bool) {
	if len(values) != 1 || len(values[0]) > 32 {
		return 0, false
	}
	d, err := time.ParseDuration(values[0])
	if err != nil || d < MinHeartbeat || d > MaxHeartbeat {
		return 0, false
	}
	return d, true
}

// DialProgress is how long an agent with heartbeats on lets a dial go
// unanswered before it sends HEARTBEAT with the dial's random
// ([DialProgressHeartbeat]), so that a server waiting for the DIAL_RSP of
// a slow endpoint knows the agent is alive and has read the DIAL_REQ (see
// the server's UnansweredDialTimeout, four times as long by default). A
// plain HEARTBEAT says only that the agent is alive: an agent that sends
// them but reads nothing is still unresponsive.
const DialProgress = 500 * time.Millisecond

// PacketHeartbeat is the type of servercount's HEARTBEAT packet, sent
// only on streams whose handshake turned heartbeats on. It carries
// nothing: its arrival is the news. Its number is beside PacketWindow's,
// far from upstream's types.
const PacketHeartbeat client.PacketType = 1001

// Heartbeat returns HEARTBEAT.
func Heartbeat() *client.Packet { return &client.Packet{Type: PacketHeartbeat} }

// DialProgressHeartbeat returns HEARTBEAT that answers the dial random
// for now: it carries a DIAL_RSP payload with the random and nothing
// else. A server that does not know it takes it for a plain HEARTBEAT.
func DialProgressHeartbeat(random int64) *client.Packet {
	return &client.Packet{Type: PacketHeartbeat, Payload: &client.Packet_DialResponse{DialResponse: &client.DialResponse{Random: random}}}
}

// DialProgressOf returns the random of a HEARTBEAT made by
// DialProgressHeartbeat, and false for a plain one.
func DialProgressOf(pkt *client.Packet) (random int64, ok bool) {
	r := pkt.GetDialResponse().GetRandom()
	return r, pkt.GetType() == PacketHeartbeat && r != 0
}
