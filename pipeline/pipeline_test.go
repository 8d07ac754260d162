package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/bradfitz/gomemcache/memcache"

	dto "github.com/prometheus/client_model/go"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

func userMessage(t *testing.T, offset int64, id int) Message {
	t.Helper()
	m := debezium("c", "shop", "users", nil, row("id", id))
	return Message{Value: m.Value, Pos: rules.Position{Topic: "t", Offset: offset}}
}

// TestPipelineWaitsForMemcached checks that a batch is retried, without
// giving up, until memcached comes back, and then applied.
func TestPipelineWaitsForMemcached(t *testing.T) {
	addr := testsvc.ClosedAddr(t)
	r := newRig(t, daemonRules, rigOptions{mcAddr: addr})
	msgs := []Message{userMessage(t, 0, 1), userMessage(t, 1, 2)}
	done := make(chan error, 1)
	var b Batch
	go func() { done <- r.pipeline.Process(context.Background(), &b, msgs, CoalesceOptions{}) }()
	waitFor(t, 10*time.Second, func() string {
		if n := metricValue(r.metrics.applyRetries); n < 5 {
			return fmt.Sprintf("%v retries, want 5", n)
		}
		return ""
	})
	select {
	case err := <-done:
		t.Fatalf("Process returned %v while memcached was down", err)
	default:
	}
	testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{Addr: addr})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Process: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Process did not finish after memcached came back")
	}
	for _, id := range []string{"1", "2"} {
		v, err := strconv.ParseInt(r.get("ns:user:"+id), 10, 64)
		if err != nil || v <= 0 {
			t.Errorf("ns:user:%s = %q, want a namespace version", id, r.get("ns:user:"+id))
		}
	}
	if n := metricValue(r.metrics.ops.WithLabelValues("bump", "added")); n != 2 {
		t.Errorf("bump/added ops = %v, want 2", n)
	}
	if n := metricValue(r.metrics.ops.WithLabelValues("bump", "failed")); n != 0 {
		t.Errorf("bump/failed ops = %v, want 0: retried ops are not failures", n)
	}
}

// TestPipelineCancelAbandons checks that cancelling a waiting batch
// returns the context's error and counts no op as failed.
func TestPipelineCancelAbandons(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{mcAddr: testsvc.ClosedAddr(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var b Batch
	go func() { done <- r.pipeline.Process(ctx, &b, []Message{userMessage(t, 0, 1)}, CoalesceOptions{}) }()
	waitFor(t, 10*time.Second, func() string {
		if n := metricValue(r.metrics.applyRetries); n < 1 {
			return "no retry yet"
		}
		return ""
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Process = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Process ignored the cancellation")
	}
	if n := metricValue(r.metrics.ops.WithLabelValues("bump", "failed")); n != 0 {
		t.Errorf("bump/failed ops = %v, want 0", n)
	}
}

// TestPipelinePermanentFailureHolds applies an op the writer refuses for
// good (an invalid key) next to a good one, under a rule file without a
// fallback namespace: the good op is applied, but the batch does not
// complete, so nothing is committed past the undelivered invalidation.
func TestPipelinePermanentFailureHolds(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	rule := r.pipeline.cfg.Rules.Rule("user-profile")
	r.set("ns:user:8", "1")
	b := Batch{Ops: []rules.Op{
		{Kind: rules.OpBump, Rule: rule, Key: r.key("ns:user: 7")}, // cacheops.ErrInvalidKey
		{Kind: rules.OpBump, Rule: rule, Key: r.key("ns:user:8")},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := r.pipeline.Apply(ctx, &b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply = %v, want it to hold until its context ends", err)
	}
	if got := r.get("ns:user:8"); got != "2" {
		t.Errorf("ns:user:8 = %q, want 2", got)
	}
	// The last attempt may end with the context rather than the key's
	// error; the failures before it were counted.
	if n := metricValue(r.metrics.ops.WithLabelValues("bump", "failed")); n < 1 {
		t.Errorf("bump/failed ops = %v, want at least 1", n)
	}
	if !strings.Contains(r.logs.String(), "no fallback namespace or generation covers its rule") {
		t.Errorf("the log does not say why the partition holds")
	}
}

// TestPipelinePoisonWithoutDLQ checks that without a DLQ poison messages
// are counted and the batch completes.
func TestPipelinePoisonWithoutDLQ(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	msgs := []Message{
		{Value: []byte("not json"), Pos: rules.Position{Topic: "t", Offset: 0}},
		userMessage(t, 1, 4),
	}
	var b Batch
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.pipeline.Process(ctx, &b, msgs, CoalesceOptions{}); err != nil {
		t.Fatalf("Process: %v", err)
	}
	if b.Stats.Poison != 1 || len(b.Poison) != 1 || b.Poison[0].Message.Pos.Offset != 0 {
		t.Errorf("poison = %+v (stats %+v), want the message at offset 0", b.Poison, b.Stats)
	}
	if n := metricValue(r.metrics.poison.WithLabelValues("t")); n != 1 {
		t.Errorf("poison metric = %v, want 1", n)
	}
	if r.get("ns:user:4") == "<missing>" {
		t.Errorf("the good message was not applied")
	}
}

// TestPlanStats checks the counts Plan reports and the recount option.
func TestPlanStats(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	comment := func(off int64, op string, before, after map[string]any) Message {
		m := debezium(op, "blog", "comments", before, after)
		return Message{Value: m.Value, Pos: rules.Position{Topic: "t", Offset: off}}
	}
	msgs := []Message{
		comment(0, "c", nil, row("id", 1, "post_id", 9)),
		comment(1, "c", nil, row("id", 2, "post_id", 9)),
		comment(2, "d", row("id", 1, "post_id", 9), nil),
		comment(3, "c", nil, row("id", 3, "post_id", 10)),
		{Value: []byte(`{"op":"c","after":{"id":1},"source":{"db":"shop","table":"orders"}}`), Pos: rules.Position{Topic: "t", Offset: 4}},
		{Value: nil, Pos: rules.Position{Topic: "t", Offset: 5}},
	}
	var b Batch
	r.pipeline.Plan(&b, msgs, CoalesceOptions{})
	want := BatchStats{Messages: 6, Events: 5, Unmatched: 1, Skipped: 1}
	got := b.Stats
	got.Plan, got.Coalesce = rules.PlanStats{}, CoalesceStats{}
	if got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	if b.Stats.Coalesce.In != 4 || len(b.Ops) != 2 || b.Ops[0].Delta != 1 || b.Ops[1].Delta != 1 {
		t.Errorf("ops = %v (coalesce %+v), want +1 at post 9 and +1 at post 10", b.Ops, b.Stats.Coalesce)
	}
	r.pipeline.Plan(&b, msgs, CoalesceOptions{Recount: true})
	if len(b.Ops) != 2 || b.Ops[0].Kind != rules.OpRecount || b.Ops[1].Kind != rules.OpRecount || b.Stats.Coalesce.DeltasToRecounts != 2 {
		t.Errorf("with Recount: ops = %v", b.Ops)
	}
}

func TestBackoff(t *testing.T) {
	p := &Pipeline{cfg: Config{RetryMin: 50 * time.Millisecond, RetryMax: 5 * time.Second}}
	prevMax := time.Duration(0)
	for attempt := range 40 {
		d := p.backoff(attempt)
		ceiling := min(50*time.Millisecond<<min(attempt, 20), 5*time.Second)
		if d > ceiling || d < ceiling*4/5 {
			t.Errorf("backoff(%d) = %s, want within [%s, %s]", attempt, d, ceiling*4/5, ceiling)
		}
		prevMax = max(prevMax, d)
	}
	if prevMax > 5*time.Second {
		t.Errorf("backoff exceeded its cap: %s", prevMax)
	}
}

// BenchmarkPipelinePlan measures decode, plan and coalesce of a batch of
// 2000 Debezium messages (no I/O).
func BenchmarkPipelinePlan(b *testing.B) {
	path := filepath.Join(b.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(daemonRules, "PREFIX", "bench:")), 0o644); err != nil {
		b.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		b.Fatal(err)
	}
	mc := memcache.New("127.0.0.1:1") // never contacted by Plan
	p, err := New(Config{
		Rules:    rs,
		Writer:   cacheops.NewTextApplier(mc, nil, nil, cacheops.Config{}, nil),
		Counters: counters.New(mc, nil, counters.Config{}, nil),
	})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]Message, 0, 2000)
	for i := range 2000 {
		var m Message
		switch i % 3 {
		case 0:
			m = debezium("u", "shop", "users", row("id", i%500, "name", "a"), row("id", i%500, "name", "b"))
		case 1:
			m = debezium("c", "shop", "user_interests", nil, row("user_id", i%200, "interest_id", i))
		default:
			m = debezium("c", "blog", "comments", nil, row("id", i, "post_id", i%100))
		}
		msgs = append(msgs, Message{Value: m.Value, Pos: rules.Position{Topic: "t", Offset: int64(i)}})
	}
	var batch Batch
	b.ReportAllocs()
	for b.Loop() {
		p.Plan(&batch, msgs, CoalesceOptions{})
	}
	st := batch.Stats.Coalesce
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(msgs)), "ns/msg")
	b.ReportMetric(float64(st.In), "planned-ops")
	b.ReportMetric(float64(st.Out), "coalesced-ops")
}

// TestEventAge: every applied row change that names its source time is
// observed in cachewarden_event_age_seconds, as now minus that time.
func TestEventAge(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	sourceTs := time.Now().Add(-5 * time.Second).UnixMilli()
	var msgs []Message
	for i := range 4 {
		v := fmt.Appendf(nil, `{"op":"c","after":{"id":%d},"source":{"db":"shop","table":"users","ts_ms":%d}}`, i+1, sourceTs)
		msgs = append(msgs, Message{Value: v, Pos: rules.Position{Topic: "t", Offset: int64(i)}})
	}
	msgs = append(msgs, Message{Value: []byte(`{"op":"c","after":{"id":9},"source":{"db":"shop","table":"users"}}`), Pos: rules.Position{Topic: "t", Offset: 4}})
	var b Batch
	r.pipeline.Plan(&b, msgs, CoalesceOptions{})
	if err := r.pipeline.Apply(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	var m dto.Metric
	if err := r.metrics.eventAge.Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 4 {
		t.Errorf("%d ages observed, want 4 (the event without a source time is not)", h.GetSampleCount())
	}
	if mean := h.GetSampleSum() / float64(h.GetSampleCount()); mean < 5 || mean > 65 {
		t.Errorf("mean age %.3fs, want about 5s", mean)
	}
}

// TestFetchToApply: every message the daemon fetched is observed in
// cachewarden_fetch_to_apply_seconds when its batch has been applied, as
// the time since its fetch; messages without a fetch time (replay) are
// not.
func TestFetchToApply(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	early, late := time.Now().Add(-2*time.Second), time.Now()
	var msgs []Message
	for i := range 6 {
		fetched := early
		switch {
		case i >= 3 && i < 5:
			fetched = late
		case i == 5:
			fetched = time.Time{}
		}
		v := fmt.Appendf(nil, `{"op":"c","after":{"id":%d},"source":{"db":"shop","table":"users"}}`, i+1)
		msgs = append(msgs, Message{Value: v, Fetched: fetched, Pos: rules.Position{Topic: "t", Offset: int64(i)}})
	}
	var b Batch
	if err := r.pipeline.Process(context.Background(), &b, msgs, CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	var m dto.Metric
	if err := r.metrics.fetchToApply.Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 5 {
		t.Errorf("%d messages observed, want 5 (the one without a fetch time is not)", h.GetSampleCount())
	}
	// Three waited about 2 s, two almost nothing.
	if sum := h.GetSampleSum(); sum < 6 || sum > 6+5*60 {
		t.Errorf("sum of waits %.3fs, want about 6s", sum)
	}
	for _, bk := range h.GetBucket() {
		if bk.GetUpperBound() == 1 && bk.GetCumulativeCount() != 2 {
			t.Errorf("%d messages waited at most 1s, want 2", bk.GetCumulativeCount())
		}
	}
}

// TestBatchReleaseDropsMessages: after Release a reused Batch keeps no
// message of the batch alive, decoded or poison, so that the fetch
// responses they share can be collected while the partition is quiet.
func TestBatchReleaseDropsMessages(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	good := []byte(`{"op":"c","after":{"id":7,"name":"x"},"source":{"db":"shop","table":"users"}}`)
	poison := []byte(`{"op":"c","after":{"id":`)
	wGood, wPoison := weak.Make(&good[0]), weak.Make(&poison[0])
	msgs := []Message{{Value: good, Pos: rules.Position{Topic: "t", Offset: 0}}, {Value: poison, Pos: rules.Position{Topic: "t", Offset: 1}}}
	var b Batch
	r.pipeline.Plan(&b, msgs, CoalesceOptions{})
	if len(b.Ops) == 0 || len(b.Poison) != 1 {
		t.Fatalf("planned %d ops, %d poison", len(b.Ops), len(b.Poison))
	}
	msgs, good, poison = nil, nil, nil
	b.Release()
	runtime.GC()
	runtime.GC()
	if wGood.Value() != nil || wPoison.Value() != nil {
		t.Errorf("messages still reachable after Release: decoded %v, poison %v", wGood.Value() != nil, wPoison.Value() != nil)
	}
	runtime.KeepAlive(&b)
}

// TestLabelCounts: runs of one label and labels that come back later are
// all counted, and reset forgets them.
func TestLabelCounts(t *testing.T) {
	var c labelCounts[string]
	for _, l := range []string{"a", "a", "b", "a", "c", "c", "c", "b"} {
		c.add(l)
	}
	if got := c.all(); len(got) != 3 || got["a"] != 3 || got["b"] != 2 || got["c"] != 3 {
		t.Errorf("counts %v", got)
	}
	c.add("a")
	if got := c.all(); got["a"] != 4 {
		t.Errorf("after one more a: %v", got)
	}
	c.reset()
	c.add("b")
	if got := c.all(); len(got) != 1 || got["b"] != 1 {
		t.Errorf("after reset: %v", got)
	}
}

// countingObserver is a ChangeObserver that records the partition counts
// it is told.
type countingObserver struct{ counts map[string]int }

func (*countingObserver) BeforeApply(context.Context, []rules.Op) func([]rules.Op, []cacheops.Result) {
	return nil
}
func (o *countingObserver) SetPartitionCounts(c map[string]int) { o.counts = c }

// TestPipelineTellsObserverPartitionCounts: the observer learns the
// topics' partition counts with the pipeline (it judges counters at a
// binary log position only when every partition is accounted for).
func TestPipelineTellsObserverPartitionCounts(t *testing.T) {
	o := &countingObserver{}
	p, err := New(Config{Rules: &rules.RuleSet{}, Writer: cacheops.NewTextApplier(memcache.New("127.0.0.1:1"), nil, nil, cacheops.Config{}, nil), Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	p.SetPartitionCounts(map[string]int{"cdc.blog.comments": 3})
	if o.counts["cdc.blog.comments"] != 3 {
		t.Errorf("observer told %v", o.counts)
	}
}

// TestSourceDecodedMessages: a message whose source decoded its row
// changes (Message.Events, the binary log's) is planned and applied
// without decoding its value, counted under format "binlog"; a failed one
// whose DecodeError names a table bumps that table's fallback namespace.
func TestSourceDecodedMessages(t *testing.T) {
	r := newRig(t, `
version: 1
prefix: "PREFIX"
fallback: "ns:table:{db}.{table}"
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{id}"
`, rigOptions{})
	r.set("ns:user:4", "10")
	r.set("ns:table:shop.users", "20")
	id := rules.Value{Kind: rules.KindInt, Text: "4"}
	msgs := []Message{
		{Value: []byte("not JSON: never decoded"), Pos: rules.Position{BinlogFile: "mysql-bin.000001", BinlogPos: 400},
			Events: []rules.Event{{Database: "shop", Table: "users", Operation: rules.Update,
				Before: rules.Row{{Name: "id", Value: id}}, After: rules.Row{{Name: "id", Value: id}}}}},
		{Pos: rules.Position{BinlogFile: "mysql-bin.000001", BinlogPos: 500},
			Failed: &decode.DecodeError{Offset: -1, Reason: "a column type never seen", Database: "shop", Table: "users"}},
	}
	var b Batch
	if err := r.pipeline.Process(context.Background(), &b, msgs, CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := r.get("ns:user:4"); got != "11" {
		t.Errorf("ns:user:4 = %q, want 11", got)
	}
	if got := r.get("ns:table:shop.users"); got != "21" {
		t.Errorf("ns:table:shop.users = %q, want 21: the unmapped row's table fallback bumped", got)
	}
	if n := metricValue(r.metrics.events.WithLabelValues("", "binlog", "planned")); n != 1 {
		t.Errorf("binlog events planned = %v, want 1", n)
	}
	if n := metricValue(r.metrics.lost.WithLabelValues(LostPoison, "fallback")); n != 1 {
		t.Errorf("lost poison covered = %v, want 1", n)
	}
}
