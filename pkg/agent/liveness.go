package agent

import (
	"time"

	"github.com/servercount/servercount/pkg/wire"
)

// probePeriod is how often the probe loop runs: ProbeInterval, but at
// least four times per heartbeat interval, so that an agent sends its
// unprompted heartbeat within 1.75 of its intervals, inside the
// wire.SilenceLimit the server waits, whatever ProbeInterval is.
func (cfg Config) probePeriod() time.Duration {
	if cfg.Heartbeat > 0 {
		return min(cfg.ProbeInterval, cfg.Heartbeat/4)
	}
	return cfg.ProbeInterval
}

// heartbeatIfIdle queues a HEARTBEAT when the stream's handshake turned
// heartbeats on (a server that did not gets none, whatever it sends) and
// the agent has sent nothing for idle. The agent's heartbeats answer the
// server's (wire.HeaderHeartbeat says why): the receive loop calls it
// with half the interval when a HEARTBEAT arrives, checkLiveness with
// one and a half, which leaves a server of the same interval the time to
// send its next one first. Either way the agent sends something within
// 1.5 intervals and a probe period, within the wire.SilenceLimit the
// server waits. The control queue takes it without waiting, and drops a
// second one still queued.
func (c *client) heartbeatIfIdle(now int64, idle time.Duration) {
	if c.cs.cfg.Heartbeat > 0 && c.peerHeartbeat > 0 && time.Duration(now-c.sent.Load()) >= idle {
		c.sendControl(wire.Heartbeat(), 0)
	}
}

// stalled reports whether packets have waited to be sent while nothing
// moved on the stream for d.
func (c *client) stalled(d time.Duration) bool {
	if time.Duration(c.cs.mono.Now()-c.moved.Load()) < d {
		return false
	}
	if c.senders.Load() > 0 {
		return true
	}
	c.controlMu.Lock()
	defer c.controlMu.Unlock()
	return len(c.control) > 0
}

// drop gives up on the stream, stuck or dead for reason: msg and kv are
// logged at level 0 and the end is counted under reason, once.
func (c *client) drop(reason streamEndedReason, msg string, kv ...any) {
	if c.giveUp() {
		c.cs.metrics.streamEnded(reason)
		c.logger.Info(msg, kv...)
	}
}

// giveUp ends the stream. It stops counting as held at once, so that the
// sync loop, woken, dials the replacement in its next round while the
// stream's tunnels wind down. It reports whether this call gave up, for
// the caller to say why once.
func (c *client) giveUp() bool {
	first := !c.dropped.Swap(true)
	c.cancel()
	if first {
		c.cs.heldChanged()
		// The count may be out of date: a server that went away may have
		// a replacement at a new address.
		c.cs.recount()
		c.cs.wakeSync()
	}
	return first
}

// checkLiveness does the periodic checks of a stream at now, a reading
// of ClientSet.mono: a
// HEARTBEAT if the agent sent nothing for 1.5 of its intervals (between,
// it answers the server's: heartbeatIfIdle), and the end of a
// stream whose server sent nothing for wire.SilenceLimit of its interval
// while the receive loop waited (the server is dead, or the path to it),
// or whose receive loop has been inside one packet for the stall timeout
// (the loop waits on something it should not: the backstop ends it).
func (c *client) checkLiveness(now int64) {
	if c.dropped.Load() {
		return
	}
	c.heartbeatIfIdle(now, c.cs.cfg.Heartbeat*3/2)
	if c.peerHeartbeat > 0 {
		silence := wire.Silence(c.peerHeartbeat)
		if w := c.waiting.Load(); w != 0 && time.Duration(now-w) >= silence {
			c.drop(streamEndedSilent, "Dropped a proxy-server that sent nothing, not even a heartbeat, for too long; the agent will connect again", "silence", silence, "serverHeartbeat", c.peerHeartbeat, "address", c.addr)
			return
		}
	}
	if d := c.cs.cfg.StreamStallTimeout; d > 0 {
		if h := c.handling.Load(); h != 0 && time.Duration(now-h) >= d {
			c.drop(streamEndedReceiveStuck, "Ended a proxy-server stream whose receive loop was stuck inside one packet; the agent will connect again", "stallTimeout", d)
		}
	}
}
