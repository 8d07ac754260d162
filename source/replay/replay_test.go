package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/planout"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// ndjson joins message values into an NDJSON file body.
func ndjson(values ...[]byte) string {
	var b strings.Builder
	for _, v := range values {
		b.Write(v)
		b.WriteByte('\n')
	}
	return b.String()
}

func (r *rig) replayer(cfg ReplayConfig) *Replayer {
	r.t.Helper()
	cfg.Pipeline = r.pipeline
	if cfg.Logger == nil {
		cfg.Logger = r.log
	}
	rp, err := NewReplayer(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return rp
}

// TestReplayFile replays a file in batches of two against real memcached
// and MySQL: bumps and set ops are applied batch by batch, counter deltas
// spread over several batches end as one recount per key, with the
// values MySQL has.
func TestReplayFile(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	createComments(t, db, 9, 3)
	createComments(t, db, 10, 2)

	comment := func(op string, id, post int) []byte {
		if op == "d" {
			return debezium(op, "blog", "comments", row("id", id, "post_id", post), nil).Value
		}
		return debezium(op, "blog", "comments", nil, row("id", id, "post_id", post)).Value
	}
	input := ndjson(
		comment("c", 1, 9), // batch 1
		debezium("c", "shop", "users", nil, row("id", 1, "name", "a")).Value,
		comment("c", 2, 10), // batch 2
		[]byte("not json"),
		comment("d", 1, 9), // batch 3
		debezium("c", "shop", "user_interests", nil, row("user_id", 7, "interest_id", 2)).Value,
		debezium("u", "shop", "users", row("id", 1, "name", "a"), row("id", 1, "name", "b")).Value, // batch 4
		comment("c", 3, 9),
		nil, // batch 5: a tombstone
		debezium("d", "shop", "user_interests", row("user_id", 7, "interest_id", 1), nil).Value,
	)

	for _, tt := range []struct {
		name        string
		maxPending  int
		setAppend   bool
		recounts    int64
		setRebuilds int64
		bumpedUser1 string
	}{
		// Post 9 has deltas in batches 1, 3 and 4, post 10 in batch 2:
		// two keys, two recounts. interests:7 has tokens in batches 3
		// and 5: its rule has no load query, so it is deleted, once.
		{"one recount per key", 0, false, 2, 1, "12"},
		// Appending instead, the tokens land in order.
		{"set tokens appended", 0, true, 2, 0, "14"},
		// With room for one key the recounts and rebuilds run after every
		// batch that has one: a key seen again is recounted again.
		{"recounts run early", 1, false, 4, 2, "16"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.maxPending == 0 && !tt.setAppend {
				r.set("ns:user:1", "10")
			}
			r.set("interests:7", "+1 ")
			r.set("comments:9", "100")
			r.set("comments:10", "50")
			before := metricValue(r.metrics.ops.WithLabelValues("recount", "recounted"))

			var report bytes.Buffer
			rp := r.replayer(ReplayConfig{BatchSize: 2, MaxPendingRecounts: tt.maxPending, SetAppend: tt.setAppend, Report: &report})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sum, err := rp.Replay(ctx, ReplayInput{File: strings.NewReader(input), FileLines: 10})
			if err != nil {
				t.Fatalf("Replay: %v", err)
			}
			if got := r.get("comments:9"); got != "3" {
				t.Errorf("comments:9 = %q, want MySQL's 3", got)
			}
			if got := r.get("comments:10"); got != "2" {
				t.Errorf("comments:10 = %q, want MySQL's 2", got)
			}
			if got := r.get("ns:user:1"); got != tt.bumpedUser1 {
				t.Errorf("ns:user:1 = %q, want %s (bumped in two batches)", got, tt.bumpedUser1)
			}
			wantSet := "<missing>"
			if tt.setAppend {
				wantSet = "+1 +2 -1 "
			}
			if got := r.get("interests:7"); got != wantSet {
				t.Errorf("interests:7 = %q, want %q", got, wantSet)
			}
			recounted := metricValue(r.metrics.ops.WithLabelValues("recount", "recounted")) - before
			if int64(recounted) != tt.recounts || sum.Recounts != tt.recounts {
				t.Errorf("%v recounts applied, summary %d; want %d", recounted, sum.Recounts, tt.recounts)
			}
			if n := metricValue(r.metrics.ops.WithLabelValues("count", "incr")); n != 0 {
				t.Errorf("%v counter deltas applied; replay must recount instead", n)
			}
			want := ReplaySummary{Messages: 10, Events: 8, Skipped: 1, Poison: 1, Recounts: tt.recounts, SetRebuilds: tt.setRebuilds}
			// Ops: bumps of user 1 (batches 1 and 4), the bumps of the
			// generations of the set and count rules' tables that cover
			// the poison message (its table is unknown), and the two set
			// appends when appending.
			want.Ops = 4
			if tt.setAppend {
				want.Ops = 6
			}
			got := sum
			got.Duration = 0
			if got != want {
				t.Errorf("summary %+v, want %+v", got, want)
			}
			if rep := report.String(); !strings.HasPrefix(rep, "line 4: cdc: decode") || strings.Count(rep, "\n") != 1 {
				t.Errorf("report = %q, want one line for line 4", rep)
			}
		})
	}
}

// TestReplayDryRunFile checks that a dry run of a file writes exactly what
// PlanStream writes, on stdout and on the error stream, followed on stdout
// by the recounts and set rebuilds a replay runs at its end.
func TestReplayDryRunFile(t *testing.T) {
	input, err := os.ReadFile("../cmd/cachewarden/testdata/plan/maxwell.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths("../cmd/cachewarden/testdata/plan/inventory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w := cacheops.NewTextApplier(memcache.New(testsvc.ClosedAddr(t)), nil, nil, cacheops.Config{}, nil)
	p, err := NewPipeline(PipelineConfig{Rules: rs, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	dec := &decode.Decoder{Format: decode.FormatMaxwell}
	var planOut, planErr bytes.Buffer
	psum, err := planout.Stream(context.Background(), bytes.NewReader(input), &planOut, &planErr, dec, rs, planout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out, report bytes.Buffer
	rp, err := NewReplayer(ReplayConfig{Pipeline: p, Report: &report, BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := rp.DryRun(context.Background(), ReplayInput{File: bytes.NewReader(input), Decoder: dec}, &out)
	if err != nil {
		t.Fatal(err)
	}
	want := planOut.String() + endOpLines(t, rs, planOut.String())
	if out.String() != want || planOut.Len() == 0 {
		t.Errorf("dry run output differs from plan's followed by the end ops:\n--- dry run\n%s--- want\n%s", out.String(), want)
	}
	if report.String() != planErr.String() || planErr.Len() == 0 {
		t.Errorf("dry run reports differ from plan's:\n--- dry run\n%s--- plan\n%s", report.String(), planErr.String())
	}
	if sum.Messages != int64(psum.Lines) || sum.Ops != int64(psum.Ops) || sum.Poison != int64(psum.Failed) || sum.Events != int64(psum.Events) {
		t.Errorf("summary %+v does not match plan's %+v", sum, psum)
	}
}

// endOpLines derives, from `plan` output, the lines a dry run adds at
// its end: one per counter or set key, in key order, without "line".
func endOpLines(t *testing.T, rs *rules.RuleSet, plan string) string {
	t.Helper()
	byName := map[string]*rules.Rule{}
	for _, r := range rs.Rules() {
		byName[r.Name] = r
	}
	ends := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(plan), "\n") {
		var op struct{ Rule, Op, Key string }
		if err := json.Unmarshal([]byte(line), &op); err != nil {
			t.Fatalf("plan line %q: %v", line, err)
		}
		kind := ""
		switch {
		case op.Op == "count" || op.Op == "recount":
			kind = "recount"
		case strings.HasPrefix(op.Op, "set_") && byName[op.Rule].Query != "":
			kind = "set_rebuild"
		case strings.HasPrefix(op.Op, "set_"):
			kind = "set_delete"
		default:
			continue
		}
		if _, ok := ends[op.Key]; !ok {
			ends[op.Key] = fmt.Sprintf(`{"rule":%q,"op":%q,"key":%q}`, op.Rule, kind, op.Key) + "\n"
		}
	}
	keys := make([]string, 0, len(ends))
	for k := range ends {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(ends[k])
	}
	if b.Len() == 0 {
		t.Fatal("the plan has no counter or set op: the end ops prove nothing")
	}
	return b.String()
}

// produceTo writes msgs to one partition of topic.
func produceTo(t *testing.T, brokers []string, topic string, partition int, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(kafka.Message, ...int) int { return partition }),
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s:%d: %v", topic, partition, err)
	}
}

// at stamps a message with a time.
func at(m kafka.Message, ts time.Time) kafka.Message {
	m.Time = ts
	return m
}

// TestReplayKafka replays ranges of a two-partition topic chosen by time
// and by offsets, against real memcached and MySQL.
func TestReplayKafka(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	createComments(t, db, 9, 4)
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 2, topic)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	minute := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	// Partition 0: users 1..5 at minutes 0..4.
	var p0 []kafka.Message
	for i := range 5 {
		p0 = append(p0, at(debezium("c", "shop", "users", nil, row("id", i+1)), minute(i)))
	}
	produceTo(t, brokers, topic, 0, p0...)
	// Partition 1: comments on post 9 at minutes 0..3, and a poison
	// message at minute 4.
	produceTo(t, brokers, topic, 1,
		at(debezium("c", "blog", "comments", nil, row("id", 1, "post_id", 9)), minute(0)),
		at(debezium("c", "blog", "comments", nil, row("id", 2, "post_id", 9)), minute(1)),
		at(debezium("d", "blog", "comments", row("id", 1, "post_id", 9), nil), minute(2)),
		at(debezium("c", "blog", "comments", nil, row("id", 3, "post_id", 9)), minute(3)),
		at(kafka.Message{Value: []byte(`{"op":"c","after":{"id":`)}, minute(4)),
	)
	conn := KafkaConn{Brokers: brokers}
	bound := func(s string) ReplayBound {
		t.Helper()
		if s == "" {
			return ReplayBound{}
		}
		b, err := ParseReplayBound(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name       string
		from, to   string
		ranges     []PartitionRange
		users      []int // users whose namespace was bumped
		recounts   int64
		poisonLine string
	}{
		{
			name: "from a time", from: minute(2).Format(time.RFC3339),
			ranges:   []PartitionRange{{topic, 0, 2, 5}, {topic, 1, 2, 5}},
			users:    []int{3, 4, 5},
			recounts: 1, poisonLine: topic + ":1:4: cdc: decode",
		},
		{
			name: "between times", from: minute(1).Format(time.RFC3339), to: minute(3).Format(time.RFC3339),
			ranges:   []PartitionRange{{topic, 0, 1, 3}, {topic, 1, 1, 3}},
			users:    []int{2, 3},
			recounts: 1,
		},
		{
			name: "listed offsets only", from: topic + ":0:1", to: topic + ":0:3",
			ranges: []PartitionRange{{topic, 0, 1, 3}},
			users:  []int{2, 3},
		},
		{
			name: "earliest to a time", from: "earliest", to: minute(1).Format(time.RFC3339),
			ranges:   []PartitionRange{{topic, 0, 0, 1}, {topic, 1, 0, 1}},
			users:    []int{1},
			recounts: 1,
		},
		{
			name: "nothing that recent", from: minute(60).Format(time.RFC3339),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ranges, err := ResolveReplayRanges(ctx, conn, []string{topic}, bound(tt.from), bound(tt.to), nil)
			if err != nil {
				t.Fatalf("ResolveReplayRanges: %v", err)
			}
			if !reflect.DeepEqual(ranges, tt.ranges) {
				t.Fatalf("ranges %v, want %v", ranges, tt.ranges)
			}
			r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
			r.set("comments:9", "100")
			var report lockedBuffer
			rp := r.replayer(ReplayConfig{Kafka: conn, BatchSize: 2, Report: &report})
			sum, err := rp.Replay(ctx, ReplayInput{Ranges: ranges})
			if err != nil {
				t.Fatalf("Replay: %v", err)
			}
			for id := 1; id <= 5; id++ {
				got := r.get(fmt.Sprintf("ns:user:%d", id))
				if want := contains(tt.users, id); want == (got == "<missing>") {
					t.Errorf("ns:user:%d = %q; bumped: %v, want %v", id, got, !want, want)
				}
			}
			wantCount := "100" // not replayed: untouched
			if tt.recounts > 0 {
				wantCount = "4"
			}
			if got := r.get("comments:9"); got != wantCount {
				t.Errorf("comments:9 = %q, want %s", got, wantCount)
			}
			if sum.Recounts != tt.recounts {
				t.Errorf("%d recounts, want %d", sum.Recounts, tt.recounts)
			}
			var total int64
			for _, pr := range tt.ranges {
				total += pr.Len()
			}
			if sum.Messages != total {
				t.Errorf("%d messages replayed, want %d", sum.Messages, total)
			}
			rep := report.String()
			if tt.poisonLine != "" && (!strings.HasPrefix(rep, tt.poisonLine) || sum.Poison != 1) {
				t.Errorf("report %q (%d poison), want one line starting %q", rep, sum.Poison, tt.poisonLine)
			}
			if tt.poisonLine == "" && rep != "" {
				t.Errorf("unexpected report %q", rep)
			}
		})
	}

	t.Run("dry run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ranges, err := ResolveReplayRanges(ctx, conn, []string{topic}, bound(minute(3).Format(time.RFC3339)), ReplayBound{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, daemonRules, rigOptions{prefix: "p:"})
		var out, report bytes.Buffer
		rp := r.replayer(ReplayConfig{Kafka: conn, Report: &report, Parallel: 4})
		if _, err := rp.DryRun(ctx, ReplayInput{Ranges: ranges}, &out); err != nil {
			t.Fatal(err)
		}
		want := `{"line":1,"rule":"user-profile","op":"bump","key":"p:ns:user:4"}
{"line":2,"rule":"user-profile","op":"bump","key":"p:ns:user:5"}
{"line":3,"rule":"post-comments","op":"count","key":"p:comments:9","delta":1}
{"rule":"post-comments","op":"recount","key":"p:comments:9"}
`
		if out.String() != want {
			t.Errorf("dry run output:\n%s\nwant:\n%s", out.String(), want)
		}
		if rep := report.String(); !strings.HasPrefix(rep, "line 4: "+topic+":1:4: cdc: decode") {
			t.Errorf("report = %q", rep)
		}
	})

	t.Run("a range beyond the log fails", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r := newRig(t, daemonRules, rigOptions{})
		rp := r.replayer(ReplayConfig{Kafka: conn, IdleTimeout: 300 * time.Millisecond})
		sum, err := rp.Replay(ctx, ReplayInput{Ranges: []PartitionRange{{topic, 0, 3, 9}}})
		if err == nil || !strings.Contains(err.Error(), "no message for 300ms at offset 5 (the range ends at 9)") {
			t.Errorf("Replay = %v, want the idle error", err)
		}
		if sum.Messages != 2 {
			t.Errorf("%d messages replayed, want 2", sum.Messages)
		}
	})

	t.Run("bad bounds", func(t *testing.T) {
		ctx := context.Background()
		for _, tt := range []struct {
			topics   []string
			from, to string
			want     string
		}{
			{[]string{"no-such-topic"}, "earliest", "", "no-such-topic"},
			{nil, topic + ":7:0", "", topic + ":7, which does not exist"},
			{[]string{topic}, "other:0:0", "", "topic other, which is not replayed"},
			{nil, topic + ":0:0", topic + ":1:5", "which the start does not list"},
		} {
			_, err := ResolveReplayRanges(ctx, conn, tt.topics, bound(tt.from), bound(tt.to), nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ResolveReplayRanges(%v, %s, %s) = %v, want an error with %q", tt.topics, tt.from, tt.to, err, tt.want)
			}
		}
	})
}

func contains(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// TestReplayFileDecoder checks which decoder a replay file gets.
func TestReplayFileDecoder(t *testing.T) {
	cfg := config.Kafka{
		Format:       "maxwell",
		TopicFormats: map[string]string{"flat": "debezium-flat"},
		TopicTables:  map[string]string{"flat": "shop.users"},
	}
	for _, tt := range []struct {
		topic, format, table string
		want                 decode.Format
		wantTable            string
	}{
		{"", "", "", decode.FormatMaxwell, ""},
		{"flat", "", "", decode.FormatDebeziumFlat, "shop.users"},
		{"other", "", "", decode.FormatMaxwell, ""},
		{"flat", "canal", "a.b", decode.FormatCanal, "a.b"},
		{"", "auto", "", decode.FormatAuto, ""},
	} {
		var format *decode.Format
		if tt.format != "" {
			f, err := decode.ParseFormat(tt.format)
			if err != nil {
				t.Fatal(err)
			}
			format = &f
		}
		dec, err := ReplayFileDecoder(cfg, tt.topic, format, tt.table)
		if err != nil || dec.Format != tt.want || dec.Table != tt.wantTable {
			t.Errorf("ReplayFileDecoder(%q, %q, %q) = %+v, %v; want %s with table %q", tt.topic, tt.format, tt.table, dec, err, tt.want, tt.wantTable)
		}
	}
	avro := decode.FormatAvro
	if _, err := ReplayFileDecoder(cfg, "", &avro, ""); !errors.Is(err, decode.ErrNotInFile) || !strings.Contains(err.Error(), "JSON lines") {
		t.Errorf("format avro for a file: %v, want an error saying a file holds JSON lines", err)
	}
	avroTopic := config.Kafka{Format: "avro"}
	if _, err := ReplayFileDecoder(avroTopic, "", nil, ""); !errors.Is(err, decode.ErrNotInFile) {
		t.Errorf("kafka.format avro for a file: %v, want ErrNotInFile", err)
	}
	if _, err := ReplayFileDecoder(config.Kafka{Format: "protobuf"}, "", nil, ""); err == nil {
		t.Errorf("format protobuf accepted")
	}
}

// TestReplaySummaryString checks the summary line.
func TestReplaySummaryString(t *testing.T) {
	s := ReplaySummary{Messages: 5000, Events: 4990, Skipped: 7, Poison: 3, Ops: 3200, Recounts: 45, Failed: 1, Duration: 2 * time.Second}
	s.SetRebuilds = 12
	want := "5000 messages in 2s (2500 msg/s): 4990 events, 7 skipped, 3 poison; 3200 ops, 45 recounts, 12 set rebuilds, 1 failed"
	if got := s.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	s.PendingRecounts = 9
	if got := s.String(); !strings.HasSuffix(got, "; 9 recounts and set rebuilds not run") {
		t.Errorf("String() = %q, want the recounts not run", got)
	}
	if s.Failures() != 4 {
		t.Errorf("Failures() = %d, want 4", s.Failures())
	}
}

// TestReplayInterrupted cancels a replay that waits for memcached: it
// returns the context's error and counts the recounts it did not run.
func TestReplayInterrupted(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{mcAddr: testsvc.ClosedAddr(t)})
	input := ndjson(
		debezium("c", "blog", "comments", nil, row("id", 1, "post_id", 9)).Value,
		debezium("c", "blog", "comments", nil, row("id", 2, "post_id", 10)).Value,
		debezium("c", "shop", "users", nil, row("id", 1)).Value,
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var sum ReplaySummary
	var err error
	go func() {
		defer close(done)
		sum, err = r.replayer(ReplayConfig{}).Replay(ctx, ReplayInput{File: strings.NewReader(input)})
	}()
	waitFor(t, 10*time.Second, func() string {
		if metricValue(r.metrics.applyRetries) < 1 {
			return "no retry yet"
		}
		return ""
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Replay ignored the cancellation")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Replay = %v, want context.Canceled", err)
	}
	if sum.PendingRecounts != 2 || sum.Recounts != 0 {
		t.Errorf("summary %+v, want 2 recounts not run", sum)
	}
}
