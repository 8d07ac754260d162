package main

import (
	"strings"
	"testing"
)

// TestDemoPointsAtItsCommand checks that `cachewarden demo`, whose harness
// is no longer linked in, says where the demo is, with status 2.
func TestDemoPointsAtItsCommand(t *testing.T) {
	for _, args := range [][]string{{"demo"}, {"demo", "--rounds", "1"}, {"help", "demo"}} {
		_, _, err := invoke(t, "", args...)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "make demo") || !strings.Contains(err.Error(), "cmd/cachewarden-demo") {
			t.Errorf("%q: exit code %d, error %v; want 2 and the way to the demo's command", args, exitCode(err), err)
		}
	}
}
