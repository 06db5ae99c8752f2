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

// StallTimeout turns --stream-stall-timeout into the packages' setting:
// the flag's 0 is "never", which they spell -1 (their 0 is the default).
func StallTimeout(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}
