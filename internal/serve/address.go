package serve

import (
	"net"
	"strconv"
)

// Address is where a port listens: a host (empty: every interface) and a
// port (0: any free one).
type Address struct {
	Host string
	Port int
}

// String returns the address as host:port.
func (a Address) String() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// Listen listens on a for what (named in the error).
func (a Address) Listen(what string) (net.Listener, error) { return Listen(what, a.Host, a.Port) }
