//go:build race

package rules_test

// raceEnabled reports whether the race detector is on; it makes sync.Pool
// drop items at random, which changes allocation counts.
const raceEnabled = true
