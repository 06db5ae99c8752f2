// Package metric registers the Prometheus collectors of the
// proxy-server, the proxy-agent and the features they share.
package metric

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector of cs with reg; a nil reg registers
// nothing, for a component built without a registry. It tries them all,
// so that the error names every name already taken, not only the first,
// wrapped as "register <what>: ...".
func Register(reg prometheus.Registerer, what string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("register %s: %w", what, err)
	}
	return nil
}
