// Package fuzztest holds what the repository's fuzz targets share: their
// seeds are written as a readable table and added to the corpus here.
package fuzztest

import "testing"

// Add adds each seed to f's corpus, for a fuzz function of one argument.
func Add[T any](f *testing.F, seeds ...T) {
	f.Helper()
	for _, s := range seeds {
		f.Add(s)
	}
}

// AddBytes adds each seed to f's corpus as a []byte, for a fuzz function
// that reads raw bytes but whose seeds read best as text.
func AddBytes(f *testing.F, seeds ...string) {
	f.Helper()
	for _, s := range seeds {
		f.Add([]byte(s))
	}
}
