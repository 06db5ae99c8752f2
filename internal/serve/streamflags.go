package serve

import (
	"fmt"
	"time"

	"github.com/servercount/servercount/pkg/wire"
)

// CheckStreamFlags checks the flags both binaries have for their tunnels:
// --stream-stall-timeout (0 turns the check off), the write timeout
// named writeFlag (--endpoint-write-timeout on the agent,
// --frontend-write-timeout on the server) and --tunnel-window. It returns
// one error per bad flag, each naming it.
func CheckStreamFlags(stall time.Duration, writeFlag string, write time.Duration, window int) []error {
	var errs []error
	if stall < 0 {
		errs = append(errs, fmt.Errorf("invalid --stream-stall-timeout %v: must be positive, or 0 to turn the check off", stall))
	}
	if write <= 0 {
		errs = append(errs, fmt.Errorf("invalid %s %v: must be positive", writeFlag, write))
	}
	if err := wire.CheckTunnelWindow(window); err != nil {
		errs = append(errs, fmt.Errorf("invalid --tunnel-window %w", err))
	}
	return errs
}

// CheckLivenessFlags checks the flags both binaries have for the
// liveness of their peers: --keepalive-time and --keepalive-timeout (the
// gRPC keepalive, which upstream's peers answer) and
// --heartbeat-interval (servercount's heartbeats; 0 turns them off). It
// returns one error per bad flag, each naming it.
func CheckLivenessFlags(keepalive, keepaliveTimeout, heartbeat time.Duration) []error {
	var errs []error
	if keepalive <= 0 {
		errs = append(errs, fmt.Errorf("invalid --keepalive-time %v: must be positive", keepalive))
	}
	if keepaliveTimeout <= 0 {
		errs = append(errs, fmt.Errorf("invalid --keepalive-timeout %v: must be positive", keepaliveTimeout))
	}
	if heartbeat != 0 {
		if err := wire.CheckHeartbeat(heartbeat); err != nil || heartbeat < 0 {
			errs = append(errs, fmt.Errorf("invalid --heartbeat-interval %v: want %v to %v, or 0 to send and expect none", heartbeat, wire.MinHeartbeat, wire.MaxHeartbeat))
		}
	}
	return errs
}

// Off turns a duration flag whose 0 means "never" or "none"
// (--stream-stall-timeout, --heartbeat-interval, --unanswered-dial-timeout,
// upstream's --backend-dial-timeout) into the packages' setting, which
// spell that -1: their 0 is the default.
func Off(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}
