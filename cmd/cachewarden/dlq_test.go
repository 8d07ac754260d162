package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// dlqBrokenRules are replayRules with a mistake in each rule: they name
// columns the events do not have, so the daemon sends the events to the
// dead-letter topic.
const dlqBrokenRules = `version: 1
prefix: %q
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{email}"
  - name: post-comments
    table: blog.comments
    count:
      key: "comments:{post}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      args: [post_id]
`

// dlqEntries runs `dlq list --json` and returns its entries.
func dlqEntries(t *testing.T, cfg string, args ...string) []dlqEntry {
	t.Helper()
	out, errOut, err := invoke(t, "", append([]string{"dlq", "list", "-c", cfg, "--json"}, args...)...)
	if err != nil {
		t.Fatalf("dlq list: %v\n%s", err, errOut)
	}
	var entries []dlqEntry
	for line := range strings.Lines(out) {
		var e dlqEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("dlq list --json line %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	return entries
}

// TestDLQCommand runs the daemon with rules that make every event
// poison, lists the dead letters it wrote, fixes the rules and re-drives
// them: the bump is applied, the counter recounted from MySQL (not
// incremented), a message that is still poison says why, and the dead
// letter of an oversized batch is not re-driven.
func TestDLQCommand(t *testing.T) {
	mc, mcAddr, dsn, rulesPath, prefix := replayServices(t, 2)
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(dlqBrokenRules, prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	topic := "cdc-" + testsvc.Unique()
	dlq := topic + ".dlq"
	brokers := testsvc.KafkaTopics(t, 1, topic, dlq)
	cfg := filepath.Join(t.TempDir(), "cachewarden.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`kafka:
  brokers: [%s]
  group: cw-dlq-%s
  topics: [%s]
  dlq_topic: %s
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [%s]
http:
  listen: "127.0.0.1:0"
`, strings.Join(brokers, ","), testsvc.Unique(), topic, dlq, mcAddr, dsn, rulesPath)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	values := []string{userEvent(5), commentEvent("c", 3, 9), `{"op":"c","after":`}
	for i, v := range values {
		if err := w.WriteMessages(ctx, kafka.Message{Topic: topic, Value: []byte(v), Time: t0.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, cfg)
	waitUntil(t, 30*time.Second, func() string {
		if n := len(dlqEntries(t, cfg)); n < len(values) {
			return fmt.Sprintf("%d dead letters", n)
		}
		return ""
	})
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	// The dead letter of a batch too large to decompress: no value.
	err := w.WriteMessages(ctx, kafka.Message{Topic: dlq, Headers: []protocol.Header{
		{Key: "cachewarden.error", Value: []byte("record batch decompresses past 1048576 bytes")},
		{Key: "cachewarden.topic", Value: []byte(topic)},
		{Key: "cachewarden.partition", Value: []byte("0")},
		{Key: "cachewarden.offset", Value: []byte("0")},
		{Key: "cachewarden.end-offset", Value: []byte("3")},
	}})
	if err != nil {
		t.Fatal(err)
	}

	entries := dlqEntries(t, cfg)
	if len(entries) != 4 {
		t.Fatalf("dlq list: %d entries, want 4: %+v", len(entries), entries)
	}
	for i, e := range entries[:3] {
		if e.Offset != int64(i) || e.Topic != topic || e.OriginOffset != int64(i) || e.Size != len(values[i]) || !e.Redrivable {
			t.Errorf("entry %d: %+v, want DLQ offset %d, origin %s:0:%d, size %d, redrivable", i, e, i, topic, i, len(values[i]))
		}
		if want := t0.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano); e.Timestamp != want {
			t.Errorf("entry %d: original timestamp %q, want %q", i, e.Timestamp, want)
		}
	}
	if r := entries[0].Reason; !strings.Contains(r, `column "email" missing`) {
		t.Errorf("entry 0: reason %q", r)
	}
	if e := entries[3]; e.Redrivable || e.EndOffset == nil || *e.EndOffset != 3 || !strings.Contains(e.Note, "replay --from "+topic+":0:0 --to "+topic+":0:3") {
		t.Errorf("oversized batch's entry: %+v", e)
	}
	if got := dlqEntries(t, cfg, "--from", "2"); len(got) != 2 || got[0].Offset != 2 {
		t.Errorf("dlq list --from 2: %+v", got)
	}
	out, errOut, err := invoke(t, "", "dlq", "list", "-c", cfg, "--limit", "2")
	if err != nil {
		t.Fatalf("dlq list: %v\n%s", err, errOut)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(lines[1], topic+":0:0") || !strings.Contains(errOut, "2 dead letters shown, more follow") {
		t.Errorf("dlq list --limit 2 printed:\n%s\nstderr: %s", out, errOut)
	}

	// Still the broken rules: poison again.
	out, _, err = invoke(t, "", "dlq", "redrive", "-c", cfg, "--offset", "0")
	if err == nil || !strings.Contains(out, "0:0 "+topic+":0:0: poison again: ") || !strings.Contains(out, `column "email" missing`) {
		t.Errorf("redrive with the broken rules: %v\n%s", err, out)
	}

	// The rules fixed: a dry run plans, applies nothing.
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(replayRules, prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	counter := counterKey(t, mc, prefix)
	if err := mc.Set(&memcache.Item{Key: counter, Value: []byte("40")}); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = invoke(t, "", "dlq", "redrive", "-c", cfg, "--reason", "missing from the after image", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, errOut)
	}
	want := fmt.Sprintf(`{"line":1,"rule":"user-profile","op":"bump","key":"%[1]sns:user:5"}
{"line":2,"rule":"post-comments","op":"count","key":"%[1]scomments:9","delta":1}
{"rule":"post-comments","op":"recount","key":"%[1]scomments:9"}
`, prefix)
	if out != want {
		t.Errorf("dry run printed:\n%s\nwant:\n%s\nstderr: %s", out, want, errOut)
	}
	if got := mcGet(t, mc, prefix+"ns:user:5"); got != "<missing>" {
		t.Errorf("the dry run bumped ns:user:5 (%q)", got)
	}

	// The comment alone: its counter is recounted from MySQL (a delta
	// would have made it 41).
	out, errOut, err = invoke(t, "", "dlq", "redrive", "-c", cfg, "--offset", "1")
	if err != nil || out != "0:1 "+topic+":0:1: applied: 0 ops, 1 counter or set keys recounted or rebuilt at the end\n" {
		t.Errorf("redrive --offset 1: %v\n%s\n%s", err, out, errOut)
	}
	if got := mcGet(t, mc, counter); got != "2" {
		t.Errorf("comments:9 = %q, want MySQL's 2 (recounted, not incremented)", got)
	}

	// Every dead letter. The one still poison bumps the generations of
	// the rules' tables again, as the daemon did when it met it.
	out, errOut, err = invoke(t, "", "dlq", "redrive", "-c", cfg, "--all")
	if err == nil || !strings.Contains(err.Error(), "2 of 4 dead letters not applied") {
		t.Errorf("redrive --all: %v, want 2 of 4 not applied\n%s", err, errOut)
	}
	for _, line := range []string{
		"0:0 " + topic + ":0:0: applied: 1 ops, 0 counter or set keys",
		"0:1 " + topic + ":0:1: applied: 0 ops, 1 counter or set keys",
		"0:2 " + topic + ":0:2: poison again: ",
		"0:3 " + topic + ":0:0: not re-driven: cannot be re-driven: it marks a record batch too large to decompress",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("redrive --all lacks %q:\n%s", line, out)
		}
	}
	if got := mcGet(t, mc, prefix+"ns:user:5"); got == "<missing>" {
		t.Error("ns:user:5 was not bumped")
	}
	if got := mcGet(t, mc, counterKey(t, mc, prefix)); got != "2" {
		t.Errorf("comments:9 = %q under the generation after the re-drive, want MySQL's 2", got)
	}
}

// TestDLQUsage checks the command-line mistakes of dlq: each exits with
// status 2 and says what is wrong, before any broker is asked.
func TestDLQUsage(t *testing.T) {
	rules := filepath.Join(mustAbs(t, "testdata/plan"), "inventory.yaml")
	cfg := writeReplayConfig(t, "127.0.0.1:1", "127.0.0.1:1", "nobody@tcp(127.0.0.1:1)/none", rules)
	withDLQ := filepath.Join(t.TempDir(), "dlq.yaml")
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(withDLQ, []byte(strings.Replace(string(data), "  topics: [cdc]\n", "  topics: [cdc]\n  dlq_topic: cdc.dlq\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"dlq"}, "give a subcommand: list or redrive"},
		{[]string{"dlq", "show"}, `unknown subcommand "show"`},
		{[]string{"dlq", "list"}, "-c FILE is required"},
		{[]string{"dlq", "list", "-c", cfg}, "names no kafka.dlq_topic"},
		{[]string{"dlq", "list", "-c", withDLQ, "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"dlq", "list", "-c", withDLQ, "--from", "-1"}, "must not be negative"},
		{[]string{"dlq", "redrive", "-c", withDLQ}, "choose the dead letters"},
		{[]string{"dlq", "redrive", "-c", withDLQ, "--offset", "1", "--all"}, "give one of --offset, --offsets and --all"},
		{[]string{"dlq", "redrive", "-c", withDLQ, "--offsets", "5-2"}, `--offsets "5-2": want A-B`},
		{[]string{"dlq", "redrive", "-c", withDLQ, "--offsets", "x"}, `--offsets "x": want A-B`},
		{[]string{"dlq", "redrive", "-c", withDLQ, "--all", "extra"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
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
