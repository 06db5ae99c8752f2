package servercounter

import "slices"

// Names returns the fully qualified names a count tries, in order, for
// tests of the search list.
func (c *DNSServerCounter) Names() []string { return slices.Clone(c.cfg.names) }

// Servers returns the nameservers a count asks, in order, for tests of
// the configuration.
func (c *DNSServerCounter) Servers() []string { return slices.Clone(c.cfg.servers) }

// Stale reports whether the cache's count has expired and its refresh
// has not ended yet: for the fleet test, which steps a manual clock once
// every cache has done what it can at the clock's time.
func (c *CachedServerCounter) Stale() bool { return c.cur.Load().stale }
