package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
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
		{"no input", []string{"replay", "-c", cfg}, "give --from (Kafka or the binary log) or --file"},
		{"file and from", []string{"replay", "-c", cfg, "--file", "x", "--from", "earliest"}, "--from and --to are for Kafka"},
		{"format without file", []string{"replay", "-c", cfg, "--from", "earliest", "--format", "maxwell"}, "apply to --file only"},
		{"bad from", []string{"replay", "-c", cfg, "--from", "2026-05-01"}, "--from: \"2026-05-01\" is not an RFC 3339 time"},
		{"from in the future", []string{"replay", "-c", cfg, "--from", "2099-01-01T00:00:00Z"}, "--from 2099-01-01T00:00:00Z is in the future"},
		{"bad to", []string{"replay", "-c", cfg, "--from", "earliest", "--to", "cdc:0"}, "--to: \"cdc:0\": want topic:partition:offset"},
		{"to earliest", []string{"replay", "-c", cfg, "--from", "earliest", "--to", "earliest"}, "earliest is not an end"},
		{"avro file", []string{"replay", "-c", cfg, "--file", "x", "--format", "avro"}, "a --file holds JSON lines"},
		{"bad format", []string{"replay", "-c", cfg, "--file", "x", "--format", "protobuf"}, "--format"},
		{"bad table", []string{"replay", "-c", cfg, "--file", "x", "--table", "users"}, "want db.table"},
		{"two topics for a file", []string{"replay", "-c", cfg, "--file", "x", "--topics", "a,b"}, "--topics names 2"},
		{"bad parallel", []string{"replay", "-c", cfg, "--from", "earliest", "--parallel", "0"}, "--parallel"},
		{"bad sets", []string{"replay", "-c", cfg, "--from", "earliest", "--sets", "merge"}, `--sets "merge": want rebuild or append`},
		{"append to a past end", []string{"replay", "-c", cfg, "--from", "earliest", "--to", "2026-05-01T10:00:00Z", "--sets", "append"}, "before the live end"},
		{"append a file", []string{"replay", "-c", cfg, "--file", "x", "--sets", "append"}, "a file is not the live end"},
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
// what `plan` prints for the same file, then one line per key the replay
// would recount or rebuild at its end, and reports the same bad lines. No
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
			ends, ok := strings.CutPrefix(out, planOut)
			if !ok {
				t.Fatalf("replay --dry-run output does not start with plan's:\n--- replay\n%s--- plan\n%s", out, planOut)
			}
			checkEndOps(t, planOut, ends)
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
			if err != nil || out != planOut+ends {
				t.Errorf("replay --file - differs from plan (%v):\n%s", err, out)
			}
		})
	}
}

// endOp is a line of the end of a dry run's output.
type endOp struct {
	Line      *int
	Rule, Op  string
	Key       string
	Remainder map[string]any `json:"-"`
}

// checkEndOps checks the lines a dry run printed after the plan: one per
// counter or set key of the plan, in key order, with op recount,
// set_rebuild or set_delete and no "line".
func checkEndOps(t *testing.T, plan, ends string) {
	t.Helper()
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(plan), "\n") {
		var op endOp
		if line == "" {
			continue
		}
		if err := json.Unmarshal([]byte(line), &op); err != nil {
			t.Fatalf("plan line %q: %v", line, err)
		}
		switch {
		case op.Op == "count" || op.Op == "recount":
			want[op.Key] = "recount"
		case strings.HasPrefix(op.Op, "set_"):
			want[op.Key] = "set_"
		}
	}
	var keys []string
	for _, line := range strings.Split(strings.TrimSuffix(ends, "\n"), "\n") {
		if line == "" {
			continue
		}
		var op endOp
		if err := json.Unmarshal([]byte(line), &op); err != nil {
			t.Fatalf("end line %q: %v", line, err)
		}
		kind, ok := want[op.Key]
		switch {
		case op.Line != nil:
			t.Errorf("end line %q has a line field", line)
		case !ok:
			t.Errorf("end line %q names a key the plan does not change", line)
		case kind == "recount" && op.Op != "recount",
			kind == "set_" && op.Op != "set_rebuild" && op.Op != "set_delete":
			t.Errorf("end line %q: want %s", line, kind)
		}
		keys = append(keys, op.Key)
	}
	if len(keys) != len(want) || !sort.StringsAreSorted(keys) {
		t.Errorf("end lines name keys %v; want each of the plan's %d counter and set keys once, in order", keys, len(want))
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

// counterKey returns the key of post 9's comment counter under the
// current generation of blog.comments (docs/formats.md, "Generations"),
// creating the generation when missing.
func counterKey(t *testing.T, mc *memcache.Client, prefix string) string {
	t.Helper()
	gk := rules.GenerationKey(prefix, "blog", "comments")
	if err := mc.Add(&memcache.Item{Key: gk, Value: []byte("1782579200000000000")}); err != nil && !errors.Is(err, memcache.ErrNotStored) {
		t.Fatal(err)
	}
	it, err := mc.Get(gk)
	if err != nil {
		t.Fatal(err)
	}
	gen, ok := itemformat.ParseGeneration(it.Value)
	if !ok {
		t.Fatalf("generation %q: %q", gk, it.Value)
	}
	return itemformat.CounterKey(prefix+"comments:9", gen)
}

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
		if err := mc.Set(&memcache.Item{Key: counterKey(t, mc, prefix), Value: []byte("77")}); err != nil {
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
		if got := mcGet(t, mc, counterKey(t, mc, prefix)); got != "3" {
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
	brokers, topic, t0 := publishMinutes(t, userEvent(1), commentEvent("c", 1, 9), userEvent(2), commentEvent("c", 2, 9), userEvent(3))
	cfg := writeReplayConfig(t, strings.Join(brokers, ","), mcAddr, dsn, rulesPath)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Dry run from minute 2: offsets 2..4, lines 1..3.
	out, errOut, err := invoke(t, "", "replay", "-c", cfg, "--topics", topic, "--from", t0.Add(2*time.Minute).Format(time.RFC3339), "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, errOut)
	}
	want := fmt.Sprintf(`{"line":1,"rule":"user-profile","op":"bump","key":"%[1]sns:user:2"}
{"line":2,"rule":"post-comments","op":"count","key":"%[1]scomments:9","delta":1}
{"line":3,"rule":"user-profile","op":"bump","key":"%[1]sns:user:3"}
{"rule":"post-comments","op":"recount","key":"%[1]scomments:9"}
`, prefix)
	if out != want {
		t.Errorf("dry run printed:\n%s\nwant:\n%s", out, want)
	}
	if got := mcGet(t, mc, prefix+"ns:user:2"); got != "<missing>" {
		t.Errorf("the dry run bumped ns:user:2 (%q)", got)
	}

	// Offsets 1 and 2: the first comment and user 2.
	if err := mc.Set(&memcache.Item{Key: counterKey(t, mc, prefix), Value: []byte("40")}); err != nil {
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
	if got := mcGet(t, mc, counterKey(t, mc, prefix)); got != "2" {
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

// publishMinutes writes values to a fresh one-partition topic, one
// message a minute from t0 on, and returns the brokers (an in-process
// broker unless CACHEWARDEN_TEST_KAFKA names one), the topic and t0.
func publishMinutes(t *testing.T, values ...string) (brokers []string, topic string, t0 time.Time) {
	t.Helper()
	topic = "cdc-" + testsvc.Unique()
	brokers = testsvc.KafkaTopics(t, 1, topic)
	t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var msgs []kafka.Message
	for i, v := range values {
		msgs = append(msgs, kafka.Message{Value: []byte(v), Time: t0.Add(time.Duration(i) * time.Minute)})
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return brokers, topic, t0
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

const replaySetRules = `version: 1
prefix: %q
rules:
  - name: user-interests
    table: shop.user_interests
    set:
      key: "interests:{user_id}"
      member: "{interest_id}"
      load: "SELECT interest_id FROM user_interests WHERE user_id = ?"
      args: [user_id]
  - name: post-tags
    table: blog.post_tags
    set:
      key: "tags:{post_id}"
      member: "{tag}"
`

func interestEvent(op string, user, interest int) string {
	img := fmt.Sprintf(`{"user_id":%d,"interest_id":%d}`, user, interest)
	before, after := "null", img
	if op == "d" {
		before, after = img, "null"
	}
	return fmt.Sprintf(`{"op":%q,"before":%s,"after":%s,"source":{"db":"shop","table":"user_interests"},"ts_ms":1}`, op, before, after)
}

func tagEvent(op string, post int, tag string) string {
	img := fmt.Sprintf(`{"post_id":%d,"tag":%q}`, post, tag)
	before, after := "null", img
	if op == "d" {
		before, after = img, "null"
	}
	return fmt.Sprintf(`{"op":%q,"before":%s,"after":%s,"source":{"db":"blog","table":"post_tags"},"ts_ms":1}`, op, before, after)
}

// TestReplaySetsToThePast replays a window that ends before a member's
// removal (--to in the past): appending the window's tokens again would
// make the removed member a member again. Every set the replay touches
// must end right (rebuilt from MariaDB by its load query) or missing (its
// rule has none). --sets append is refused for such a range, and while
// the daemon's consumer group has a member; to the live end with the
// group empty it is allowed, and the sets end right too.
func TestReplaySetsToThePast(t *testing.T) {
	mcAddr := testsvc.Memcached(t)
	mc := memcache.New(mcAddr)
	db, dsn := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE user_interests (user_id INT NOT NULL, interest_id INT NOT NULL, PRIMARY KEY (user_id, interest_id))",
		// The database as it is now: user 7 added 1, 2 and 3, then
		// removed 1; user 8 added 5.
		"INSERT INTO user_interests VALUES (7, 2), (7, 3), (8, 5)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	prefix := "cwreplay:" + testsvc.Unique() + ":"
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(replaySetRules, prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	brokers, topic, t0 := publishMinutes(t,
		interestEvent("c", 7, 1), // minute 0
		interestEvent("c", 7, 2),
		tagEvent("c", 9, "go"),
		interestEvent("c", 8, 5),
		interestEvent("d", 7, 1), // minute 4: after the window
		tagEvent("d", 9, "go"),
		interestEvent("c", 7, 3),
	)
	cfg := writeReplayConfig(t, strings.Join(brokers, ","), mcAddr, dsn, rulesPath)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The cache as the daemon left it after the last change.
	current := map[string]string{"interests:7": "+1 +2 -1 +3 ", "interests:8": "+5 ", "tags:9": "+go -go "}
	resetCache := func() {
		t.Helper()
		for k, v := range current {
			if err := mc.Set(&memcache.Item{Key: prefix + k, Value: []byte(v)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// wantRightOrMissing checks every set the replay touched against
	// MariaDB.
	wantRightOrMissing := func(what string) {
		t.Helper()
		for _, user := range []int{7, 8} {
			key := fmt.Sprintf("%sinterests:%d", prefix, user)
			got := setMembers(t, mc, key)
			if got == nil {
				continue
			}
			want := dbMembers(t, db, user)
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s: interests:%d has members %v, MariaDB %v", what, user, got, want)
			}
		}
		if got := setMembers(t, mc, prefix+"tags:9"); len(got) != 0 {
			t.Errorf("%s: tags:9 has members %v; post 9 has no tag (or the set must be missing)", what, got)
		}
	}

	resetCache()
	window := []string{"replay", "-c", cfg, "--topics", topic, "--from", "earliest", "--to", t0.Add(4 * time.Minute).Format(time.RFC3339), "--progress", "0"}
	out, errOut, err := invoke(t, "", append(window, "--dry-run")...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, errOut)
	}
	for _, want := range []string{
		fmt.Sprintf(`{"rule":"user-interests","op":"set_rebuild","key":"%sinterests:7"}`, prefix),
		fmt.Sprintf(`{"rule":"user-interests","op":"set_rebuild","key":"%sinterests:8"}`, prefix),
		fmt.Sprintf(`{"rule":"post-tags","op":"set_delete","key":"%stags:9"}`, prefix),
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("dry run does not state %s:\n%s", want, out)
		}
	}

	_, errOut, err = invoke(t, "", window...)
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, errOut)
	}
	wantRightOrMissing("replay to minute 4")
	if got := setMembers(t, mc, prefix+"interests:7"); got == nil {
		t.Errorf("interests:7 is missing; its rule has a load query: want it rebuilt")
	}
	if got := mcGet(t, mc, prefix+"tags:9"); got != "<missing>" {
		t.Errorf("tags:9 = %q; its rule has no load query: want it deleted", got)
	}
	if n := summaryCount(t, errOut, "set rebuilds"); n != 3 {
		t.Errorf("%d set rebuilds, want 3:\n%s", n, errOut)
	}

	// Appending is refused for a window in the past...
	resetCache()
	_, errOut, err = invoke(t, "", append(window, "--sets", "append")...)
	if code := exitCode(err); code != 2 || !strings.Contains(err.Error()+errOut, "before the live end") {
		t.Errorf("--sets append with --to: exit %d (%v), want 2 naming the live end", code, err)
	}
	// ... and while the daemon's group has a member.
	live := []string{"replay", "-c", cfg, "--topics", topic, "--from", "earliest", "--progress", "0", "--sets", "append"}
	member := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "cw-replay", Topic: topic, MaxWait: 50 * time.Millisecond})
	fetched := make(chan error, 1)
	go func() {
		_, err := member.FetchMessage(ctx) // joins the group
		fetched <- err
	}()
	if err := <-fetched; err != nil {
		t.Fatalf("group member: %v", err)
	}
	_, errOut, err = invoke(t, "", live...)
	if code := exitCode(err); code != 2 || !strings.Contains(err.Error()+errOut, "consumer group cw-replay has active members") {
		t.Errorf("--sets append beside a group member: exit %d (%v), want 2 naming the group\n%s", code, err, errOut)
	}
	if got := mcGet(t, mc, prefix+"interests:7"); got != current["interests:7"] {
		t.Errorf("a refused replay changed interests:7 to %q", got)
	}
	member.Close() // leaves the group
	_, errOut, err = invoke(t, "", live...)
	if err != nil {
		t.Fatalf("--sets append to the live end with no daemon: %v\n%s", err, errOut)
	}
	if got := mcGet(t, mc, prefix+"interests:7"); !strings.HasPrefix(got, current["interests:7"]) || got == current["interests:7"] {
		t.Errorf("interests:7 = %q, want the tokens appended to %q", got, current["interests:7"])
	}
	wantRightOrMissing("append to the live end")
}

// setMembers returns the members of the set at key in order, nil when it
// is missing.
func setMembers(t *testing.T, mc *memcache.Client, key string) []string {
	t.Helper()
	v := mcGet(t, mc, key)
	if v == "<missing>" {
		return nil
	}
	members := itemformat.DecodeSet([]byte(v)).Members
	sort.Strings(members)
	return append([]string{}, members...)
}

// dbMembers returns user's interests in MariaDB, sorted as text.
func dbMembers(t *testing.T, db *sql.DB, user int) []string {
	t.Helper()
	rows, err := db.Query("SELECT interest_id FROM user_interests WHERE user_id = ?", user)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
