package main

import (
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestDoctorCommand runs `cachewarden doctor` on a config whose memcached
// server is down: the report names it, and the exit status is 1. (Package
// doctor's tests cover each check against the real services.)
func TestDoctorCommand(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic, topic+".dlq")
	down := closedAddr(t)
	out, errOut, err := invoke(t, "", "doctor", "-c", writeCountConfig(t, brokers, topic, down, testsvc.MySQLDSN(t)), "--timeout", "5s")
	if code := exitCode(err); code != 1 {
		t.Errorf("exit status %d (%v), want 1\n%s%s", code, err, out, errOut)
	}
	for _, want := range []string{"ok    kafka      topic " + topic, "FAIL  memcached  " + down, "checks: "} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor's report lacks %q:\n%s", want, out)
		}
	}
}
