package serve

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
)

// RandomID returns a random 128-bit ID in hex: the default server and
// agent IDs, as upstream's are random UUIDs.
func RandomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail on Linux
	return hex.EncodeToString(b)
}

// CheckPorts returns an error for each port flag whose value is outside 0
// to 65535, in the order of the flags' names.
func CheckPorts(ports map[string]int) []error {
	var errs []error
	for _, flag := range slices.Sorted(maps.Keys(ports)) {
		if p := ports[flag]; p < 0 || p > 65535 {
			errs = append(errs, fmt.Errorf("invalid %s %d: want 0 to 65535", flag, p))
		}
	}
	return errs
}
