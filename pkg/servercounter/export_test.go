package servercounter

import "slices"

// Names returns the fully qualified names a count tries, in order, for
// tests of the search list.
func (c *DNSServerCounter) Names() []string { return slices.Clone(c.cfg.names) }

// Servers returns the nameservers a count asks, in order, for tests of
// the configuration.
func (c *DNSServerCounter) Servers() []string { return slices.Clone(c.cfg.servers) }
