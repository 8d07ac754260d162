package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// fallbackRules are daemonRules with a fallback namespace per table.
var fallbackRules = strings.Replace(daemonRules, "rules:\n", "fallback: \"fb:{db}.{table}\"\nrules:\n", 1)

// TestPermanentFailureBumpsFallback: an op that fails for good under a
// rule file with a fallback namespace is replaced by a bump of its
// table's fallback key, and the batch completes.
func TestPermanentFailureBumpsFallback(t *testing.T) {
	r := newRig(t, fallbackRules, rigOptions{})
	rule := r.pipeline.Rules().Rule("user-profile")
	r.set("fb:shop.users", "5")
	r.set("ns:user:8", "1")
	b := pipeline.Batch{Ops: []rules.Op{
		{Kind: rules.OpBump, Rule: rule, Key: r.key("ns:user: 7")}, // cacheops.ErrInvalidKey
		{Kind: rules.OpBump, Rule: rule, Key: r.key("ns:user:8")},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.pipeline.Apply(ctx, &b); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got := r.get("fb:shop.users"); got != "6" {
		t.Errorf("fallback fb:shop.users = %q, want 6", got)
	}
	if got := r.get("ns:user:8"); got != "2" {
		t.Errorf("ns:user:8 = %q, want 2", got)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostOpFailed, "covered=fallback"); n != 1 {
		t.Errorf("lost op_failed/fallback = %v, want 1", n)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_apply_retries_total"); n != 0 {
		t.Errorf("%v retries of a covered permanent failure", n)
	}
}

// TestPoisonBumpsFallback: a message of a known table that cannot be
// planned bumps that table's fallback; an undecodable one bumps the
// fallbacks of its topic's tables (here every table, the topic naming
// none).
func TestPoisonBumpsFallback(t *testing.T) {
	r := newRig(t, fallbackRules, rigOptions{})
	for _, k := range []string{"fb:shop.users", "fb:shop.user_interests", "fb:blog.comments"} {
		r.set(k, "10")
	}
	missingKey := debezium("c", "shop", "users", nil, row("name", "no id"))
	msgs := []pipeline.Message{
		{Value: missingKey.Value, Pos: rules.Position{Topic: "t", Offset: 0}},
	}
	var b pipeline.Batch
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.pipeline.Process(ctx, &b, msgs, pipeline.CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := r.get("fb:shop.users") + " " + r.get("fb:blog.comments"); got != "11 10" {
		t.Errorf("after an unplannable users change: fb:shop.users fb:blog.comments = %s, want 11 10", got)
	}
	msgs = []pipeline.Message{{Value: []byte(`{"op":`), Pos: rules.Position{Topic: "t", Offset: 1}}}
	if err := r.pipeline.Process(ctx, &b, msgs, pipeline.CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"fb:shop.users": "12", "fb:shop.user_interests": "11", "fb:blog.comments": "11"} {
		if got := r.get(k); got != want {
			t.Errorf("after an undecodable message: %s = %s, want %s", k, got, want)
		}
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostPoison, "covered=fallback"); n != 2 {
		t.Errorf("lost poison/fallback = %v, want 2", n)
	}
	// The undecodable message may have been a change of any table: the
	// generations of the tables with set and count rules moved too
	// (docs/formats.md, "Generations"), created at a namespace start.
	for _, rule := range []string{"user-interests", "post-comments"} {
		gk := r.pipeline.Rules().Rule(rule).Generation
		if g, ok := itemformat.ParseGeneration([]byte(r.get(strings.TrimPrefix(gk, r.prefix)))); !ok || g < 1<<60 {
			t.Errorf("generation %s = %q after an undecodable message, want one created", gk, r.get(strings.TrimPrefix(gk, r.prefix)))
		}
	}
}

// TestLostChangeCoveredOnlyWhenEveryRuleIs: without fallback namespaces a
// lost change of a table with only set and count rules is covered (by
// their generation), one of a table with a bump rule is not.
func TestLostChangeCoveredOnlyWhenEveryRuleIs(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b pipeline.Batch
	interests := debezium("c", "shop", "user_interests", nil, row("active", 1))
	if err := r.pipeline.Process(ctx, &b, []pipeline.Message{{Value: interests.Value, Pos: rules.Position{Topic: "t", Offset: 0}}}, pipeline.CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	gk := r.pipeline.Rules().Rule("user-interests").Generation
	if got := r.get(strings.TrimPrefix(gk, r.prefix)); got == "<missing>" {
		t.Errorf("generation %s not bumped for an unplannable user_interests change", gk)
	}
	users := debezium("c", "shop", "users", nil, row("name", "no id"))
	if err := r.pipeline.Process(ctx, &b, []pipeline.Message{{Value: users.Value, Pos: rules.Position{Topic: "t", Offset: 1}}}, pipeline.CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	if f, n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostPoison, "covered=fallback"), testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostPoison, "covered=none"); f != 1 || n != 1 {
		t.Errorf("lost poison: %v fallback, %v none; want the interests change covered and the users change not", f, n)
	}
}

// TestRetentionGap deletes records of a partition before the daemon read
// them. With kafka.offset_reset fail the partition stops, the daemon is
// not ready and nothing is committed; with earliest it continues at the
// log start after bumping the fallback namespace of the topic's table.
func TestRetentionGap(t *testing.T) {
	for _, policy := range []OffsetReset{ResetFail, ResetEarliest} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			topic := "shop.users." + testsvc.Unique()
			group := "cw-" + testsvc.Unique()
			brokers := testsvc.KafkaTopics(t, 1, topic)
			r := newRig(t, fallbackRules, rigOptions{})
			r.set("fb:shop.users", "100")
			var msgs []kafka.Message
			for id := range 10 {
				msgs = append(msgs, debezium("u", "shop", "users", row("id", id), row("id", id)))
				r.set(fmt.Sprintf("ns:user:%d", id), "1")
			}
			produce(t, brokers, topic, msgs[:4]...)
			d, stop := r.daemonWith(brokers, group, func(c *Config) { c.OffsetReset = policy; c.StallTimeout = time.Hour }, topic)
			waitFor(t, 20*time.Second, func() string {
				if off, _ := committedMeta(t, brokers, group, topic, 0); off != 4 {
					return fmt.Sprintf("committed %d, want 4", off)
				}
				return ""
			})
			must(t, stop())
			produce(t, brokers, topic, msgs[4:]...)
			deleteRecords(t, brokers, topic, 0, 7) // offsets 4, 5, 6 never read
			d, stop = r.daemonWith(brokers, group, func(c *Config) { c.OffsetReset = policy; c.StallTimeout = time.Hour }, topic)
			defer stop()
			if policy == ResetFail {
				waitFor(t, 20*time.Second, func() string {
					if len(d.Stalled()) == 0 {
						return "partition not reported stalled"
					}
					return ""
				})
				if d.Ready() {
					t.Errorf("ready with a stopped partition: %v", d.Stalled())
				}
				if !strings.Contains(d.Stalled()[0].Reason, "kafka.offset_reset") {
					t.Errorf("stalled reason %q does not name kafka.offset_reset", d.Stalled()[0].Reason)
				}
				if off, _ := committedMeta(t, brokers, group, topic, 0); off != 4 {
					t.Errorf("committed %d, want 4", off)
				}
				if got := r.get("ns:user:8"); got != "1" {
					t.Errorf("ns:user:8 = %q: applied past the gap", got)
				}
				return
			}
			waitFor(t, 20*time.Second, func() string {
				if got := r.get("ns:user:9"); got != "2" {
					return "ns:user:9 = " + got
				}
				return ""
			})
			if got := r.get("fb:shop.users"); got != "101" {
				t.Errorf("fallback fb:shop.users = %q, want 101", got)
			}
			if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostRetention, "covered=fallback"); n != 1 {
				t.Errorf("lost retention/fallback = %v, want 1", n)
			}
		})
	}
}

// TestRefusedWriteIsNoFailure: ops the write guard refuses inside the
// applier (the membership expired after the pipeline's own check) are
// not op failures: the batch returns the refusal at once, with no
// fallback bump, no retry and nothing counted as lost.
func TestRefusedWriteIsNoFailure(t *testing.T) {
	r := newRig(t, fallbackRules, rigOptions{})
	rule := r.pipeline.Rules().Rule("user-profile")
	r.set("fb:shop.users", "5")
	r.set("ns:user:8", "1")
	expired := errors.New("session expired")
	var checks atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = cacheops.WithGuard(ctx, func() error {
		if checks.Add(1) == 1 {
			return nil // the pipeline's check before the attempt
		}
		return expired
	})
	b := pipeline.Batch{Ops: []rules.Op{{Kind: rules.OpBump, Rule: rule, Key: r.key("ns:user:8")}}}
	err := r.pipeline.Apply(ctx, &b)
	if !errors.Is(err, cacheops.ErrWriteRefused) || !errors.Is(err, expired) {
		t.Fatalf("Apply = %v, want the refusal", err)
	}
	if got := r.get("ns:user:8") + " " + r.get("fb:shop.users"); got != "1 5" {
		t.Errorf("ns:user:8 fb:shop.users = %s, want 1 5 (nothing sent)", got)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostOpFailed, "covered=fallback"); n != 0 {
		t.Errorf("lost op_failed/fallback = %v for a refused write", n)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_apply_retries_total"); n != 0 {
		t.Errorf("%v retries of a refused write", n)
	}
}

// TestUnknownOperationIsPoison: a change event whose operation type the
// decoder does not know (Debezium, Maxwell and Canal) goes to the DLQ
// with the reason, bumps its table's fallback namespace (only that
// table's, though the topic names none) and is counted as an
// invalidation lost to poison, through the daemon and a broker.
func TestUnknownOperationIsPoison(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	dlqTopic := "dlq-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic, dlqTopic)
	dlq, err := NewDLQ(KafkaConn{Brokers: brokers}, dlqTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	r := newRig(t, fallbackRules, rigOptions{poison: dlq})
	for _, k := range []string{"fb:shop.users", "fb:shop.user_interests", "fb:blog.comments"} {
		r.set(k, "10")
	}
	r.set("ns:user:3", "1")
	unknown := []kafka.Message{
		debezium("x", "shop", "users", nil, row("id", 3)),
		{Value: []byte(`{"database":"shop","table":"users","type":"upsert","ts":1,"data":{"id":3}}`)},
		{Value: []byte(`{"data":[{"id":"3"}],"database":"shop","table":"users","isDdl":false,"type":"REPLACE","es":1,"ts":1}`)},
	}
	produce(t, brokers, topic, append(unknown,
		// Messages without row changes stay skipped.
		kafka.Message{Value: []byte(`{"database":"shop","table":"users","type":"table-alter","ts":1}`)},
		kafka.Message{Value: []byte(`{"data":null,"database":"shop","table":"users","isDdl":false,"type":"QUERY"}`)},
		debezium("u", "shop", "users", row("id", 3), row("id", 3)),
	)...)
	_, stop := r.daemon(brokers, group, topic)
	waitCommitted(t, brokers, group, topic, 6)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.get("ns:user:3"); got != "2" {
		t.Errorf("ns:user:3 = %q, want 2", got)
	}
	// Bumps of one key in one batch coalesce: 11 to 13.
	if got := r.get("fb:shop.users"); got < "11" || got > "13" {
		t.Errorf("fb:shop.users = %s, want 11 to 13", got)
	}
	for _, k := range []string{"fb:shop.user_interests", "fb:blog.comments"} {
		if got := r.get(k); got != "10" {
			t.Errorf("%s = %s, want 10: only the named table's fallback is bumped", k, got)
		}
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostPoison, "covered=fallback"); n != 3 {
		t.Errorf("lost poison/fallback = %v, want 3", n)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_poison_messages_total", "topic="+topic); n != 3 {
		t.Errorf("poison messages = %v, want 3", n)
	}
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: dlqTopic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, w := range []string{`unknown operation type "x"`, `unknown operation type "upsert"`, `unknown operation type "REPLACE"`} {
		m, err := reader.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("DLQ record %d: %v", i, err)
		}
		h := map[string]string{}
		for _, hd := range m.Headers {
			h[hd.Key] = string(hd.Value)
		}
		if string(m.Value) != string(unknown[i].Value) || h[HeaderOffset] != fmt.Sprint(i) || !strings.Contains(h[HeaderError], w) {
			t.Errorf("DLQ record %d: value %s, offset %s, error %q; want offset %d with %q", i, m.Value, h[HeaderOffset], h[HeaderError], i, w)
		}
	}
	if !strings.Contains(r.logs.String(), `unknown operation type \"x\"`) {
		t.Errorf("no poison log line names the unknown op:\n%s", r.logs.String())
	}
}
