package kafka

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/source/replay"
	"github.com/segmentio/kafka-go"
)

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
			rp := r.replayer(replay.Config{BatchSize: 2, Report: &report})
			sum, err := rp.Replay(ctx, replay.Input{Streams: replayStreams(conn, ranges)})
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
		rp := r.replayer(replay.Config{Report: &report, Parallel: 4})
		if _, err := rp.DryRun(ctx, replay.Input{Streams: replayStreams(conn, ranges)}, &out); err != nil {
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
		rp := r.replayer(replay.Config{})
		short := RangeStream{Range: PartitionRange{topic, 0, 3, 9}, Conn: conn, IdleTimeout: 300 * time.Millisecond}
		sum, err := rp.Replay(ctx, replay.Input{Streams: []replay.Stream{short}})
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
