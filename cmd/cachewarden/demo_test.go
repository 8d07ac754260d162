package main

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestDemo runs `cachewarden demo` on the test services, as `make demo`
// does, in a database of its own and with an in-process broker.
func TestDemo(t *testing.T) {
	mc := testsvc.Memcached(t)
	dsn := testsvc.MySQLDSN(t)
	database := "cwtest_demo_" + testsvc.Unique()
	t.Cleanup(func() {
		if db, err := sql.Open("mysql", dsn); err == nil {
			db.Exec("DROP DATABASE IF EXISTS " + database)
			db.Close()
		}
	})
	for _, format := range []string{"debezium", "canal", "debezium-avro"} {
		t.Run(format, func(t *testing.T) {
			out, errOut, err := invoke(t, "", "demo", "-c", "../../configs/cachewarden.yaml", "--kafka", "",
				"--memcached", mc, "--mysql", dsn, "--database", database, "--format", format, "--rounds", "2", "--size", "10")
			if err != nil {
				t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
			}
			for _, want := range []string{
				"in-process Kafka-protocol broker",
				"round 2: ",
				"daemon caught up in",
				"copied to cachewarden.dlq",
				"consistency 100.000% (all)",
				"\nOK after ",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("demo output lacks %q:\n%s", want, out)
				}
			}
			if format == "debezium-avro" && !strings.Contains(out, "in-process schema registry at http://") {
				t.Errorf("the Avro demo does not show its registry:\n%s", out)
			}
		})
	}
}

func TestDemoUsage(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--format", "avro"},
		{"demo", "--database", "x; DROP"},
		{"demo", "--rounds", "0"},
		{"demo", "extra"},
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
