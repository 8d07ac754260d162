package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// closedAddr returns a loopback address where nothing listens.
var closedAddr = testsvc.ClosedAddr

// jsonRecords parses every non-empty line of s that starts with '{' as a
// slog JSON record, and returns them and the lines that are not records.
func jsonRecords(s string) (recs []map[string]any, other []string) {
	for _, line := range strings.Split(s, "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] != nil {
			recs = append(recs, rec)
			continue
		}
		other = append(other, line)
	}
	return recs, other
}

// writeFirstHourConfig writes a config with a text log at level info (so
// that the flags' json and other levels show) and returns its path.
func writeFirstHourConfig(t *testing.T, broker, mc, dsn string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cachewarden.yaml")
	rules, err := filepath.Abs("../../configs/rules")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`kafka:
  brokers: [%s]
  group: cw-firsthour-%s
  topics: [cdc]
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [%s]
http:
  listen: "127.0.0.1:0"
log:
  format: text
  level: info
`, broker, testsvc.Unique(), mc, dsn, rules)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGlobalLogFlagsRun checks that `run` logs in the format and at the
// level of the global flags, not those of the config's log section.
func TestGlobalLogFlagsRun(t *testing.T) {
	cfg := writeFirstHourConfig(t, closedAddr(t), closedAddr(t), "root@tcp("+closedAddr(t)+")/x")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runWithInput(ctx, strings.NewReader(""), []string{"--log-format", "json", "--log-level", "warn", "run", "-c", cfg}, &stdout, &stderr)
	}()
	// memcached is down: the daemon warns that it is not ready.
	waitUntil(t, 20*time.Second, func() string {
		recs, _ := jsonRecords(stderr.String())
		for _, r := range recs {
			if strings.Contains(fmt.Sprint(r["msg"]), "memcached unreachable") {
				return ""
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, stderr.String())
		default:
		}
		return "no JSON warning about memcached yet:\n" + stderr.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	recs, other := jsonRecords(stderr.String())
	if len(other) > 0 {
		t.Errorf("lines that are not JSON records (--log-format json ignored?):\n%s", strings.Join(other, "\n"))
	}
	for _, r := range recs {
		if lvl := r["level"]; lvl == "INFO" || lvl == "DEBUG" {
			t.Errorf("a %s record despite --log-level warn: %v", lvl, r)
		}
	}
}

// TestGlobalLogFlagsReplay checks the global flags with `replay`: JSON at
// level debug over a config that asks for text at level info.
func TestGlobalLogFlagsReplay(t *testing.T) {
	cfg := writeFirstHourConfig(t, closedAddr(t), closedAddr(t), "root@tcp("+closedAddr(t)+")/x")
	file := filepath.Join(t.TempDir(), "in.ndjson")
	os.WriteFile(file, []byte(`{"op":"c","before":null,"after":{"id":1,"name":"x"},"source":{"db":"shop","table":"users"},"ts_ms":1}`+"\n"), 0o644)

	_, errOut, err := invoke(t, "", "--log-format", "json", "--log-level", "debug", "replay", "-c", cfg, "--file", file, "--dry-run")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut)
	}
	recs, _ := jsonRecords(errOut)
	levels := map[any]bool{}
	for _, r := range recs {
		levels[r["level"]] = true
	}
	if !levels["DEBUG"] || !levels["INFO"] {
		t.Errorf("want JSON records at DEBUG and INFO, got levels %v:\n%s", levels, errOut)
	}

	// Without the flags the config's text log at level info applies.
	_, errOut, err = invoke(t, "", "replay", "-c", cfg, "--file", file, "--dry-run")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut)
	}
	if recs, _ := jsonRecords(errOut); len(recs) > 0 || !strings.Contains(errOut, "level=INFO") || strings.Contains(errOut, "level=DEBUG") {
		t.Errorf("without flags, want the config's text log at info:\n%s", errOut)
	}
}

// TestPlanReportsUnknownOperation checks that a message whose operation
// type no decoder knows is reported with its line number as a failed
// line (the daemon makes it poison), and planned no op.
func TestPlanReportsUnknownOperation(t *testing.T) {
	in := strings.Join([]string{
		`{"op":"c","before":null,"after":{"id":1,"name":"x"},"source":{"db":"shop","table":"users"},"ts_ms":1}`,
		`{"op":"x","before":null,"after":{"id":2,"name":"y"},"source":{"db":"shop","table":"users"},"ts_ms":1}`,
		`{"type":"frobnicate","database":"shop","table":"users","ts":1,"data":{"id":3}}`,
		`{"op":"c","before":null,"after":{"id":4,"name":"z"},"source":{"db":"shop","table":"users"},"ts_ms":1}`,
	}, "\n") + "\n"
	out, errOut, err := invoke(t, in, "plan", "--rules", "../../configs/rules")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, errOut)
	}
	for _, want := range []string{
		`line 2: cdc: decode debezium message: op: at byte 6: unknown operation type "x"`,
		`line 3: cdc: decode maxwell message: type: at byte 8: unknown operation type "frobnicate"`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, `"line":1,`) || !strings.Contains(out, `"line":4,`) || strings.Contains(out, `"line":2,`) {
		t.Errorf("stdout:\n%s", out)
	}
	// Failed, not skipped: --strict fails on it.
	if _, _, err := invoke(t, in, "plan", "--strict", "--rules", "../../configs/rules"); err == nil {
		t.Errorf("plan --strict succeeded despite unknown operation types")
	}
}

// TestReplayBoundMistakes checks the messages of bad --from and --to.
func TestReplayBoundMistakes(t *testing.T) {
	cfg := writeReplayConfig(t, "127.0.0.1:1", "127.0.0.1:1", "", filepath.Join(mustAbs(t, "testdata/plan"), "inventory.yaml"))
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"a word", []string{"--from", "yesterday"}, []string{`"yesterday"`, `"earliest"`, "RFC 3339 time such as 2026-05-01T12:00:00Z", "topic:partition:offset"}},
		{"a clock time", []string{"--from", "10:00", "--to", "09:00"}, []string{`"10:00"`, `"earliest"`, "RFC 3339", "topic:partition:offset"}},
		{"a bad end", []string{"--from", "earliest", "--to", "tomorrow"}, []string{`"tomorrow"`, "--to takes an RFC 3339 time", "topic:partition:offset"}},
		{"times backwards", []string{"--from", "2026-05-01T10:00:00Z", "--to", "2026-05-01T09:00:00Z"}, []string{"--to 2026-05-01T09:00:00Z is not after --from 2026-05-01T10:00:00Z"}},
		{"times equal", []string{"--from", "2026-05-01T10:00:00Z", "--to", "2026-05-01T12:00:00+02:00"}, []string{"is not after --from"}},
		{"offsets backwards", []string{"--from", "cdc:0:10,cdc:1:0", "--to", "cdc:0:5"}, []string{"--to cdc:0:5 is not after --from cdc:0:10", "cdc:0 is empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := invoke(t, "", append([]string{"replay", "-c", cfg}, tt.args...)...)
			if code := exitCode(err); code != 2 {
				t.Fatalf("exit code %d (%v), want 2", code, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error()+errOut, w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// A range whose order only the broker knows is not refused here.
	if err := checkReplayOrder(mustBound(t, "cdc:0:10"), mustBound(t, "2026-05-01T09:00:00Z")); err != nil {
		t.Errorf("offsets to a time: %v", err)
	}
	if err := checkReplayOrder(mustBound(t, "cdc:0:5"), mustBound(t, "cdc:0:10,cdc:1:0")); err != nil {
		t.Errorf("a forward range: %v", err)
	}
}

func mustBound(t *testing.T, s string) kafka.ReplayBound {
	t.Helper()
	b, err := kafka.ParseReplayBound(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dropDatabase drops a test's database, if it can.
func dropDatabase(dsn, name string) {
	if db, err := sql.Open("mysql", dsn); err == nil {
		db.Exec("DROP DATABASE IF EXISTS " + name)
		db.Close()
	}
}

// TestGlobalLogFlagsOtherCommands checks the global flags with the
// commands that read no config: their debug records come as JSON.
func TestGlobalLogFlagsOtherCommands(t *testing.T) {
	event := `{"op":"c","before":null,"after":{"id":1,"name":"x"},"source":{"db":"shop","table":"users"},"ts_ms":1}` + "\n"
	for _, tt := range []struct {
		args    []string
		stdin   string
		wantMsg string
	}{
		{[]string{"plan", "--rules", "../../configs/rules"}, event, "plan finished"},
		{[]string{"rules", "test", "../../configs/rules/tests/users.yaml"}, "", "rule tests finished"},
	} {
		t.Run(tt.args[0], func(t *testing.T) {
			_, errOut, err := invoke(t, tt.stdin, append([]string{"--log-format", "json", "--log-level", "debug"}, tt.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			recs, _ := jsonRecords(errOut)
			found := false
			for _, r := range recs {
				found = found || (r["msg"] == tt.wantMsg && r["level"] == "DEBUG")
			}
			if !found {
				t.Errorf("no JSON debug record %q:\n%s", tt.wantMsg, errOut)
			}
			// At the default level the debug record is not written.
			_, errOut, _ = invoke(t, tt.stdin, tt.args...)
			if strings.Contains(errOut, tt.wantMsg) {
				t.Errorf("a debug record at level info:\n%s", errOut)
			}
		})
	}
}
