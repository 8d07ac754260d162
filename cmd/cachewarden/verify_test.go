package main

import (
	"strings"
	"testing"
)

func TestVerifyUsage(t *testing.T) {
	for _, args := range [][]string{
		{"verify"},
		{"verify", "-c", "x.yaml", "--sample", "-1"},
		{"verify", "-c", "x.yaml", "extra"},
	} {
		if _, _, err := invoke(t, "", args...); exitCode(err) != 2 {
			t.Errorf("%q: exit code %d (%v), want 2", args, exitCode(err), err)
		}
	}
	if _, errOut, err := invoke(t, "", "verify", "-c", "testdata/no-such.yaml"); exitCode(err) != exitConfig || !strings.Contains(errOut, "no-such.yaml") {
		t.Errorf("verify with a missing config: exit code %d, stderr %q", exitCode(err), errOut)
	}
}
