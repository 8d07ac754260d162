package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// writeReplayConfig writes a config file using rulesPath and returns its
// path.
func writeReplayConfig(t *testing.T, brokers, mcAddr, dsn, rulesPath string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cachewarden.yaml")
	cfg := fmt.Sprintf(`kafka:
  brokers: [%s]
  group: cw-replay
  topics: [cdc]
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [%s]
`, brokers, mcAddr, dsn, rulesPath)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplayUsage(t *testing.T) {
	cfg := writeReplayConfig(t, "127.0.0.1:1", "127.0.0.1:1", "", filepath.Join(mustAbs(t, "testdata/plan"), "inventory.yaml"))
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no config", []string{"replay", "--from", "earliest"}, "-c FILE is required"},
		{"no input", []string{"replay", "-c", cfg}, "give --from (Kafka) or --file"},
		{"file and from", []string{"replay", "-c", cfg, "--file", "x", "--from", "earliest"}, "--from and --to are for Kafka"},
		{"format without file", []string{"replay", "-c", cfg, "--from", "earliest", "--format", "maxwell"}, "apply to --file only"},
		{"bad from", []string{"replay", "-c", cfg, "--from", "2026-05-01"}, "--from: \"2026-05-01\" is not an RFC 3339 time"},
		{"bad to", []string{"replay", "-c", cfg, "--from", "earliest", "--to", "cdc:0"}, "--to: \"cdc:0\": want topic:partition:offset"},
		{"to earliest", []string{"replay", "-c", cfg, "--from", "earliest", "--to", "earliest"}, "earliest is not an end"},
		{"bad format", []string{"replay", "-c", cfg, "--file", "x", "--format", "avro"}, "--format"},
		{"bad table", []string{"replay", "-c", cfg, "--file", "x", "--table", "users"}, "want db.table"},
		{"two topics for a file", []string{"replay", "-c", cfg, "--file", "x", "--topics", "a,b"}, "--topics names 2"},
		{"bad parallel", []string{"replay", "-c", cfg, "--from", "earliest", "--parallel", "0"}, "--parallel"},
		{"argument", []string{"replay", "-c", cfg, "--from", "earliest", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := invoke(t, "", tt.args...)
			if code := exitCode(err); code != 2 {
				t.Errorf("exit code %d (%v), want 2", code, err)
			}
			if err == nil || !strings.Contains(err.Error()+errOut, tt.wantErr) {
				t.Errorf("error %v / stderr %q lacks %q", err, errOut, tt.wantErr)
			}
		})
	}
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestReplayDryRunMatchesPlan checks that `replay --dry-run --file` prints
// what `plan` prints for the same file, and reports the same bad lines. No
// service is contacted.
func TestReplayDryRunMatchesPlan(t *testing.T) {
	rulesFile := filepath.Join(mustAbs(t, "testdata/plan"), "inventory.yaml")
	cfg := writeReplayConfig(t, "127.0.0.1:1", "127.0.0.1:1", "nobody@tcp(127.0.0.1:1)/none", rulesFile)
	tests := []struct {
		input string
		args  []string
	}{
		{"debezium.ndjson", nil},
		{"debezium-flat.ndjson", []string{"--table", "inventory.customers"}},
		{"debezium-flat.ndjson", []string{"--format", "debezium-flat", "--table", "inventory.customers"}},
		{"maxwell.ndjson", []string{"--format", "maxwell"}},
		{"canal.ndjson", nil},
	}
	for _, tt := range tests {
		t.Run(tt.input+strings.Join(tt.args, " "), func(t *testing.T) {
			inputPath := filepath.Join("testdata/plan", tt.input)
			input, err := os.ReadFile(inputPath)
			if err != nil {
				t.Fatal(err)
			}
			planOut, planErr, err := invoke(t, string(input), append([]string{"plan", "--rules", rulesFile}, tt.args...)...)
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			args := append([]string{"replay", "-c", cfg, "--file", inputPath, "--dry-run"}, tt.args...)
			out, errOut, err := invoke(t, "", args...)
			if err != nil {
				t.Fatalf("replay: %v\n%s", err, errOut)
			}
			if out != planOut {
				t.Errorf("replay --dry-run output differs from plan's:\n--- replay\n%s--- plan\n%s", out, planOut)
			}
			for _, line := range strings.SplitAfter(planErr, "\n") {
				if line != "" && !strings.Contains(errOut, line) {
					t.Errorf("replay's stderr lacks plan's report %q:\n%s", line, errOut)
				}
			}
			wantSummary := fmt.Sprintf("replay (dry run) done: %d messages in ", strings.Count(string(input), "\n"))
			if !strings.Contains(errOut, wantSummary) {
				t.Errorf("stderr lacks %q:\n%s", wantSummary, errOut)
			}
			// The same through stdin.
			out, _, err = invoke(t, string(input), append([]string{"replay", "-c", cfg, "--file", "-", "--dry-run"}, tt.args...)...)
			if err != nil || out != planOut {
				t.Errorf("replay --file - differs from plan (%v):\n%s", err, out)
			}
		})
	}
}

const replayRules = `version: 1
prefix: %q
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{id}"
  - name: post-comments
    table: blog.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      args: [post_id]
`

func commentEvent(op string, id, post int) string {
	img := fmt.Sprintf(`{"id":%d,"post_id":%d}`, id, post)
	before, after := "null", img
	if op == "d" {
		before, after = img, "null"
	}
	return fmt.Sprintf(`{"op":%q,"before":%s,"after":%s,"source":{"db":"blog","table":"comments"},"ts_ms":1}`, op, before, after)
}

func userEvent(id int) string {
	return fmt.Sprintf(`{"op":"c","before":null,"after":{"id":%d},"source":{"db":"shop","table":"users"},"ts_ms":1}`, id)
}

// replayServices returns the test memcached, a fresh database with
// post 9 having n comments, the rules file for a fresh key prefix, and
// that prefix.
func replayServices(t *testing.T, comments int) (mc *memcache.Client, mcAddr, dsn, rulesPath, prefix string) {
	t.Helper()
	mcAddr = testsvc.Memcached(t)
	var db *sql.DB
	db, dsn = testsvc.MySQL(t)
	if _, err := db.Exec("CREATE TABLE comments (id INT AUTO_INCREMENT PRIMARY KEY, post_id INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for range comments {
		if _, err := db.Exec("INSERT INTO comments (post_id) VALUES (9)"); err != nil {
			t.Fatal(err)
		}
	}
	prefix = "cwreplay:" + testsvc.Unique() + ":"
	rulesPath = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(replayRules, prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	return memcache.New(mcAddr), mcAddr, dsn, rulesPath, prefix
}

func mcGet(t *testing.T, mc *memcache.Client, key string) string {
	t.Helper()
	it, err := mc.Get(key)
	if err == memcache.ErrCacheMiss {
		return "<missing>"
	}
	if err != nil {
		t.Fatalf("memcached get %s: %v", key, err)
	}
	return string(it.Value)
}

// summaryCount returns the number before label in a summary line.
func summaryCount(t *testing.T, stderr, label string) int {
	t.Helper()
	m := regexp.MustCompile(`(\d+) ` + label + `\b`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no %q count in:\n%s", label, stderr)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestReplayFileCommand replays a file against real memcached and MySQL:
// the counter ends equal to MySQL after one recount, the bad line is
// reported, and --strict turns it into exit status 1.
func TestReplayFileCommand(t *testing.T) {
	mc, mcAddr, dsn, rulesPath, prefix := replayServices(t, 3)
	cfg := writeReplayConfig(t, "127.0.0.1:1", mcAddr, dsn, rulesPath)
	input := strings.Join([]string{
		commentEvent("c", 1, 9),
		userEvent(1),
		"{not json",
		commentEvent("d", 1, 9),
		commentEvent("c", 2, 9),
		commentEvent("c", 3, 9),
	}, "\n") // no final newline
	file := filepath.Join(t.TempDir(), "events.ndjson")
	if err := os.WriteFile(file, []byte(input), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, strict := range []bool{false, true} {
		if err := mc.Set(&memcache.Item{Key: prefix + "comments:9", Value: []byte("77")}); err != nil {
			t.Fatal(err)
		}
		args := []string{"replay", "-c", cfg, "--file", file, "--batch", "2"}
		if strict {
			args = append(args, "--strict")
		}
		_, errOut, err := invoke(t, "", args...)
		wantCode := 0
		if strict {
			wantCode = 1
		}
		if code := exitCode(err); code != wantCode {
			t.Fatalf("strict=%v: exit code %d (%v), want %d\n%s", strict, code, err, wantCode, errOut)
		}
		if got := mcGet(t, mc, prefix+"comments:9"); got != "3" {
			t.Errorf("comments:9 = %q, want MySQL's count 3", got)
		}
		if !strings.Contains(errOut, "\nline 3: cdc: decode") && !strings.HasPrefix(errOut, "line 3: cdc: decode") {
			t.Errorf("stderr lacks the report of line 3:\n%s", errOut)
		}
		if n := summaryCount(t, errOut, "recounts"); n != 1 {
			t.Errorf("%d recounts, want 1 (deltas in three batches, one key):\n%s", n, errOut)
		}
		if n := summaryCount(t, errOut, "messages in"); n != 6 {
			t.Errorf("%d messages, want 6", n)
		}
		if n := summaryCount(t, errOut, "poison"); n != 1 {
			t.Errorf("%d poison, want 1", n)
		}
	}
	if got := mcGet(t, mc, prefix+"ns:user:1"); got == "<missing>" {
		t.Errorf("ns:user:1 was not bumped")
	}
}

// TestReplayKafkaCommand replays from an in-process Kafka-protocol broker
// by time (dry run) and by offsets (applied), checking that the consumer
// group is not touched.
func TestReplayKafkaCommand(t *testing.T) {
	mc, mcAddr, dsn, rulesPath, prefix := replayServices(t, 2)
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.Kafka()
	if brokers == nil {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
		if err != nil {
			t.Fatal(err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	}
	cfg := writeReplayConfig(t, strings.Join(brokers, ","), mcAddr, dsn, rulesPath)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	values := []string{userEvent(1), commentEvent("c", 1, 9), userEvent(2), commentEvent("c", 2, 9), userEvent(3)}
	var msgs []kafka.Message
	for i, v := range values {
		msgs = append(msgs, kafka.Message{Value: []byte(v), Time: t0.Add(time.Duration(i) * time.Minute)})
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	// Dry run from minute 2: offsets 2..4, lines 1..3.
	out, errOut, err := invoke(t, "", "replay", "-c", cfg, "--topics", topic, "--from", t0.Add(2*time.Minute).Format(time.RFC3339), "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, errOut)
	}
	want := fmt.Sprintf(`{"line":1,"rule":"user-profile","op":"bump","key":"%[1]sns:user:2"}
{"line":2,"rule":"post-comments","op":"count","key":"%[1]scomments:9","delta":1}
{"line":3,"rule":"user-profile","op":"bump","key":"%[1]sns:user:3"}
`, prefix)
	if out != want {
		t.Errorf("dry run printed:\n%s\nwant:\n%s", out, want)
	}
	if got := mcGet(t, mc, prefix+"ns:user:2"); got != "<missing>" {
		t.Errorf("the dry run bumped ns:user:2 (%q)", got)
	}

	// Offsets 1 and 2: the first comment and user 2.
	if err := mc.Set(&memcache.Item{Key: prefix + "comments:9", Value: []byte("40")}); err != nil {
		t.Fatal(err)
	}
	_, errOut, err = invoke(t, "", "replay", "-c", cfg, "--from", topic+":0:1", "--to", topic+":0:3", "--progress", "0")
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut)
	}
	for user, bumped := range map[int]bool{1: false, 2: true, 3: false} {
		if got := mcGet(t, mc, fmt.Sprintf("%sns:user:%d", prefix, user)); (got != "<missing>") != bumped {
			t.Errorf("ns:user:%d = %q, bumped want %v", user, got, bumped)
		}
	}
	if got := mcGet(t, mc, prefix+"comments:9"); got != "2" {
		t.Errorf("comments:9 = %q, want MySQL's 2", got)
	}
	if n := summaryCount(t, errOut, "messages in"); n != 2 {
		t.Errorf("%d messages replayed, want 2:\n%s", n, errOut)
	}
	if regexp.MustCompile(`(?m)^replay: \d`).MatchString(errOut) {
		t.Errorf("progress lines despite --progress 0:\n%s", errOut)
	}

	// The group of the config was never joined or committed.
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	resp, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: "cw-replay", Topics: map[string][]int{topic: {0}}})
	if err == nil && resp.Error == nil {
		for _, p := range resp.Topics[topic] {
			if p.CommittedOffset >= 0 {
				t.Errorf("replay committed offset %d for the group", p.CommittedOffset)
			}
		}
	}
}

// TestCountLines checks the progress total of a file.
func TestCountLines(t *testing.T) {
	for _, tt := range []struct {
		body string
		want int64
	}{
		{"", 0}, {"a", 1}, {"a\n", 1}, {"a\n\nb", 3}, {"a\r\nb\r\n", 2}, {strings.Repeat("x\n", 100_000), 100_000},
	} {
		path := filepath.Join(t.TempDir(), "f")
		os.WriteFile(path, []byte(tt.body), 0o644)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		n, err := countLines(f)
		if err != nil || n != tt.want {
			t.Errorf("countLines(%q...) = %d, %v; want %d", tt.body[:min(len(tt.body), 10)], n, err, tt.want)
		}
		rest := new(bytes.Buffer)
		rest.ReadFrom(f)
		if rest.String() != tt.body {
			t.Errorf("countLines did not rewind")
		}
		f.Close()
	}
}
