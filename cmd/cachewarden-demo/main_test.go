package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

const exampleConfig = "../../configs/cachewarden.yaml"

// invoke runs one command line in-process and returns its output and exit
// status, the message main would print included in stderr.
func invoke(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = report(run(context.Background(), args, &out, &errOut), &errOut)
	return out.String(), errOut.String(), code
}

func dropDatabase(dsn, name string) {
	if db, err := sql.Open("mysql", dsn); err == nil {
		db.Exec("DROP DATABASE IF EXISTS " + name)
		db.Close()
	}
}

// TestDemo runs the demo on the test services, as `make demo` does, in a
// database of its own and with an in-process broker.
func TestDemo(t *testing.T) {
	mc := testsvc.Memcached(t)
	dsn := testsvc.MySQLDSN(t)
	database := "cwtest_demo_" + testsvc.Unique()
	t.Cleanup(func() { dropDatabase(dsn, database) })
	for _, format := range []string{"debezium", "canal", "debezium-avro"} {
		t.Run(format, func(t *testing.T) {
			out, errOut, code := invoke(t, "-c", exampleConfig, "--kafka", "",
				"--memcached", mc, "--mysql", dsn, "--database", database, "--format", format, "--rounds", "2", "--size", "10")
			if code != 0 {
				t.Fatalf("demo: exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
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

// TestDemoBinlog runs the demo with --source binlog on the test services,
// as `make demo DEMO_FLAGS="--source binlog"` does: no broker, the daemon
// reads the binary log of the MariaDB with the binary log on.
func TestDemoBinlog(t *testing.T) {
	mc := testsvc.Memcached(t)
	testsvc.MySQLBinlog(t) // fails under CI=true when the server has no binary log
	dsn := testsvc.MySQLBinlogDSN(t)
	database := "cwtest_demo_bl_" + testsvc.Unique()
	t.Cleanup(func() { dropDatabase(dsn, database) })
	out, errOut, code := invoke(t, "-c", exampleConfig, "--source", "binlog",
		"--memcached", mc, "--mysql", dsn, "--database", database, "--rounds", "2", "--size", "10")
	if code != 0 {
		t.Fatalf("demo: exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"-> its binary log -> cachewarden, reading as a replica",
		"source     binary log of the MariaDB at ",
		"round 2: 10 transactions",
		"daemon caught up in",
		"consistency 100.000% (all)",
		"\nOK after ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`namespaces: [1-9][0-9]* bumped as planned`).MatchString(out) {
		t.Errorf("no namespace was checked as bumped:\n%s", out)
	}
	if strings.Contains(out, "broker") || strings.Contains(errOut, "ERROR") {
		t.Errorf("a broker or an error in the binlog demo:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
}

func TestDemoUsage(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"--format", "avro"}, 2, `--format "avro": want one of debezium,`},
		{[]string{"--source", "tape"}, 2, `--source "tape": want kafka or binlog`},
		{[]string{"--source", "binlog", "--format", "canal"}, 2, "--source binlog reads no broker"},
		{[]string{"--database", "x; DROP"}, 2, "want letters, digits and _"},
		{[]string{"--rounds", "0"}, 2, "at least 1"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--log-level", "loud"}, 2, `--log-level "loud"`},
		{[]string{"--log-format", "xml"}, 2, `--log-format "xml"`},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"-h"}, 0, "Usage: cachewarden-demo"},
	} {
		if _, errOut, code := invoke(t, tt.args...); code != tt.code || !strings.Contains(errOut, tt.wantErr) {
			t.Errorf("%q: exit status %d, want %d; stderr lacks %q?\n%s", tt.args, code, tt.code, tt.wantErr, errOut)
		}
	}
}

// TestDemoDefaultsAreTheExampleConfigs checks that the demo's memcached
// and database default to what configs/cachewarden.yaml names (which
// cmd/cachewarden's docs test holds to the quick start's services).
func TestDemoDefaultsAreTheExampleConfigs(t *testing.T) {
	t.Setenv(envMemcached, "") // the flag defaults, not the test's services
	cfg, err := config.LoadEnv(exampleConfig, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := newFlags(&bytes.Buffer{})
	if got, want := fs.Lookup("memcached").DefValue, strings.Join(cfg.Memcached.Servers, ","); got != want {
		t.Errorf("--memcached defaults to %s, the example config names %s", got, want)
	}
	if db := fs.Lookup("database").DefValue; !strings.HasSuffix(cfg.MySQL.DSN, "/"+db) && !strings.Contains(cfg.MySQL.DSN, "/"+db+"?") {
		t.Errorf("--database defaults to %s, the example config's DSN is %s", db, cfg.MySQL.DSN)
	}
}

// TestDemoLogFlags runs a small demo with --log-format json and
// --log-level info: the daemon's records come as JSON on stderr.
func TestDemoLogFlags(t *testing.T) {
	mc := testsvc.Memcached(t)
	dsn := testsvc.MySQLDSN(t)
	database := "cwtest_demolog_" + testsvc.Unique()
	t.Cleanup(func() { dropDatabase(dsn, database) })
	out, errOut, code := invoke(t, "--log-format", "json", "--log-level", "info", "-c", exampleConfig, "--kafka", "",
		"--memcached", mc, "--mysql", dsn, "--database", database, "--rounds", "1", "--size", "2")
	if code != 0 {
		t.Fatalf("demo: exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	records := 0
	for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] == nil {
			t.Errorf("stderr line that is not a JSON record: %s", line)
			continue
		}
		records++
	}
	if records == 0 {
		t.Errorf("no JSON log records on stderr:\n%s", errOut)
	}
}

// TestDemoMissingServices runs the demo with nothing listening where its
// memcached (and, first, its MySQL) should be: it must fail at once,
// naming what is missing, before it starts anything.
func TestDemoMissingServices(t *testing.T) {
	dsn := testsvc.MySQLDSN(t)
	mc, my := testsvc.ClosedAddr(t), testsvc.ClosedAddr(t)
	kafkaAddr := testsvc.ClosedAddr(t)
	for _, tt := range []struct {
		name, dsn, kafka string
		want             []string
	}{
		{"memcached", dsn, "", []string{"memcached at " + mc, "make services", "--memcached"}},
		{"memcached, MySQL and Kafka", "root@tcp(" + my + ")/", kafkaAddr, []string{"memcached at " + mc, "MySQL: at " + my, "--mysql", "Kafka broker " + kafkaAddr}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A hang is what this guards against: the bound only turns
			// one into a failure instead of a stuck test.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var stdout, stderr testsvc.LogBuffer
			err := run(ctx, []string{"-c", exampleConfig, "--kafka", tt.kafka, "--memcached", mc, "--mysql", tt.dsn,
				"--database", "cwtest_demo_" + testsvc.Unique(), "--rounds", "1", "--size", "1"}, &stdout, &stderr)
			if ctx.Err() != nil {
				t.Fatalf("demo hung without %s (stopped after a minute): %v", tt.name, err)
			}
			if code := report(err, &stderr); code != 1 {
				t.Fatalf("exit status %d (%v), want 1", code, err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, err)
				}
			}
			if stdout.String() != "" {
				t.Errorf("the demo started before its services were checked:\n%s", stdout.String())
			}
		})
	}
}
