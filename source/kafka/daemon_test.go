package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/pipetest"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// The shared helpers of the pipeline's and the sources' tests.
var (
	metricValue    = pipetest.MetricValue
	waitFor        = pipetest.WaitFor
	testLogger     = pipetest.TestLogger
	row            = pipetest.Row
	createComments = pipetest.CreateComments
)

const (
	daemonRules = pipetest.DaemonRules
	rebumpRules = pipetest.RebumpRules
)

func produce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// committed returns the group's committed offsets of topic's partitions
// (-1 for none).
func committed(t *testing.T, brokers []string, group, topic string, partitions ...int) map[int]int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	resp, err := c.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: partitions}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := make(map[int]int64)
	if errors.Is(resp.Error, kafka.GroupIdNotFound) {
		for _, p := range partitions {
			out[p] = -1 // the group has not committed anything yet
		}
		return out
	}
	if resp.Error != nil {
		t.Fatalf("offset fetch: %v", resp.Error)
	}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// committedMeta returns the group's committed offset of one partition
// and its metadata (-1 and "" for none).
func committedMeta(t *testing.T, brokers []string, group, topic string, partition int32) (int64, string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return -1, ""
	}
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	o, ok := offs.Lookup(topic, partition)
	if !ok {
		return -1, ""
	}
	return o.At, o.Metadata
}

// waitCommitted waits (up to 20s) until group's committed offset of
// partition 0 of topic is want.
func waitCommitted(t *testing.T, brokers []string, group, topic string, want int64) {
	t.Helper()
	waitFor(t, 20*time.Second, func() string {
		if off := committed(t, brokers, group, topic, 0)[0]; off != want {
			return fmt.Sprintf("committed offset %d, want %d", off, want)
		}
		return ""
	})
}

// lockedBuffer collects log output from many goroutines.
type lockedBuffer = testsvc.LogBuffer

// rig is a pipeline over real memcached (and MySQL when a DSN is given),
// for one test's unique key prefix.
type rig struct {
	t        *testing.T
	prefix   string
	mc       *memcache.Client
	reg      *prometheus.Registry
	metrics  *Metrics
	pm       *pipeline.Metrics
	rebump   *pipeline.Rebumper
	pipeline *pipeline.Pipeline
	log      *slog.Logger
	logs     *lockedBuffer
}

type rigOptions struct {
	mcAddr   string // default: the test memcached
	mysqlDSN string
	poison   pipeline.PoisonSink
	prefix   string // default: a unique one
	// schemas reads the schemas of Avro messages; nil: none.
	schemas *SchemaRegistry
}

// newRig loads rulesYAML (with PREFIX replaced by a unique key prefix).
func newRig(t *testing.T, rulesYAML string, opts rigOptions) *rig {
	t.Helper()
	if opts.mcAddr == "" {
		opts.mcAddr = testsvc.Memcached(t)
	}
	r := &rig{t: t, prefix: opts.prefix}
	if r.prefix == "" {
		r.prefix = "cwtest:" + testsvc.Unique() + ":"
	}
	r.log, r.logs = testLogger(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(rulesYAML, "PREFIX", r.prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	r.mc = memcache.New(opts.mcAddr)
	r.mc.Timeout = 200 * time.Millisecond
	r.mc.MaxIdleConns = 16
	var loader cacheops.SetLoader
	var recounter counters.Recounter
	if opts.mysqlDSN != "" {
		db, err := counters.OpenMySQL(opts.mysqlDSN, counters.DBConfig{}, r.log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		loader, recounter = db, db
	}
	// No compaction on a sample: the tests read exact set items.
	w := cacheops.NewTextApplier(r.mc, loader, nil, cacheops.Config{MaxConcurrency: 8, CompactSample: -1}, r.log)
	c := counters.New(r.mc, recounter, counters.Config{MaxConcurrency: 8}, r.log)
	r.reg = prometheus.NewRegistry()
	r.metrics = NewMetrics(r.reg)
	r.pm = pipeline.NewMetrics(r.reg)
	r.rebump = pipeline.NewRebumper(w, r.pm, r.log)
	pc := pipeline.Config{
		Rules: rs, Writer: w, Counters: c, Poison: opts.poison, Rebump: r.rebump,
		Metrics: r.pm, Logger: r.log, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Positions: pipeline.MemcachePositions(r.mc),
	}
	if opts.schemas != nil {
		pc.Decoder, pc.Schemas = &decode.Decoder{Schemas: opts.schemas.Cache()}, opts.schemas
	}
	r.pipeline, err = pipeline.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) key(k string) string { return r.prefix + k }

func (r *rig) set(k, v string) {
	r.t.Helper()
	if err := r.mc.Set(&memcache.Item{Key: r.key(k), Value: []byte(v)}); err != nil {
		r.t.Fatalf("memcached set %s: %v", k, err)
	}
}

// get returns the item's value, or "<missing>".
func (r *rig) get(k string) string {
	r.t.Helper()
	it, err := r.mc.Get(r.key(k))
	if err == memcache.ErrCacheMiss {
		return "<missing>"
	}
	if err != nil {
		return "<error " + err.Error() + ">"
	}
	return string(it.Value)
}

// daemon starts a daemon over the rig's pipeline; the returned stop
// cancels it and returns Run's result.
func (r *rig) daemon(brokers []string, group string, topics ...string) (*Daemon, func() error) {
	r.t.Helper()
	return r.daemonWith(brokers, group, nil, topics...)
}

// daemonWith is daemon with adjust applied to the configuration (nil:
// none).
func (r *rig) daemonWith(brokers []string, group string, adjust func(*Config), topics ...string) (*Daemon, func() error) {
	r.t.Helper()
	cfg := Config{
		Kafka:             KafkaConn{Brokers: brokers},
		Group:             group,
		Topics:            topics,
		MaxEvents:         100,
		MaxWait:           10 * time.Millisecond,
		HeartbeatInterval: 200 * time.Millisecond,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	h, err := pipeline.NewHealth(pipeline.HealthConfig{Memcached: r.mc, Interval: 50 * time.Millisecond, Metrics: r.pm, Logger: r.log})
	if err != nil {
		r.t.Fatal(err)
	}
	d, err := New(cfg, Deps{Pipeline: r.pipeline, Health: h, Metrics: r.metrics, Logger: r.log})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	var result error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				result = fmt.Errorf("Run did not return 30s after cancel")
			}
		})
		return result
	}
	r.t.Cleanup(func() { stop() })
	return d, stop
}

// debezium returns a Debezium change event (no schema envelope).
func debezium(op, db, table string, before, after map[string]any) kafka.Message {
	return kafka.Message{Value: pipetest.Debezium(op, db, table, before, after)}
}

// TestDaemonAppliesDebeziumEvents runs the daemon on Debezium events and
// checks memcached ends as planned: the first batch after the assignment
// recounts counters, later batches apply their deltas, offsets follow.
func TestDaemonAppliesDebeziumEvents(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	topic := "cdc-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)

	createComments(t, db, 9, 3)
	r.set("ns:user:1", "10")
	r.set("interests:7", "+1 ")
	r.set("comments:9", "100") // wrong: the first batch must recount it

	produce(t, brokers, topic,
		debezium("c", "shop", "users", nil, row("id", 1, "name", "a")),
		debezium("c", "shop", "users", nil, row("id", 2, "name", "b")),
		debezium("c", "shop", "user_interests", nil, row("user_id", 7, "interest_id", 2)),
		debezium("d", "shop", "user_interests", row("user_id", 7, "interest_id", 1), nil),
		debezium("c", "blog", "comments", nil, row("id", 100, "post_id", 9)),
		kafka.Message{Value: nil}, // a tombstone: skipped
	)
	d, stop := r.daemon(brokers, group, topic)

	waitCommitted(t, brokers, group, topic, 6)
	checks := map[string]string{
		"ns:user:1":   "11",
		"interests:7": "+1 +2 -1 ",
		"comments:9":  "3",
	}
	for k, want := range checks {
		if got := r.get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if v, err := strconv.ParseUint(r.get("ns:user:2"), 10, 64); err != nil || v < itemformat.NamespaceStart(time.Now().Add(-time.Hour)) {
		t.Errorf("ns:user:2 = %q, want a namespace started by itemformat.NamespaceStart", r.get("ns:user:2"))
	}
	if !d.Ready() {
		t.Errorf("not ready while consuming")
	}

	// A later batch applies its delta with incr: MySQL now says 8, but
	// the counter moves from 3 to 4, so it was not recounted.
	createComments(t, db, 9, 5)
	produce(t, brokers, topic,
		debezium("c", "blog", "comments", nil, row("id", 101, "post_id", 9)),
		debezium("u", "shop", "users", row("id", 1, "name", "a"), row("id", 1, "name", "c")),
	)
	waitCommitted(t, brokers, group, topic, 8)
	if got := r.get("comments:9"); got != "4" {
		t.Errorf("comments:9 after the second batch = %q, want 4 (incr, not a recount)", got)
	}
	if got := r.get("ns:user:1"); got != "12" {
		t.Errorf("ns:user:1 after the second batch = %q, want 12", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d.Ready() {
		t.Errorf("ready after shutdown")
	}

	metric := metricValue
	if got := testsvc.Metric(t, r.reg, "cachewarden_recounts_total", "reason=reassigned"); got != 1 {
		t.Errorf("reassigned recounts = %v, want 1", got)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_events_total", "topic="+topic, "format=debezium", "outcome=planned"); got != 7 {
		t.Errorf("planned events = %v, want 7", got)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_events_total", "topic="+topic, "outcome=skipped"); got != 1 {
		t.Errorf("skipped events = %v, want 1", got)
	}
	// One commit per batch, and the handoff's at shutdown.
	if got := metric(r.metrics.commits.WithLabelValues("ok")); got != 3 {
		t.Errorf("commits = %v, want 3", got)
	}
	if off, meta := committedMeta(t, brokers, group, topic, 0); off != 8 || meta != commitHandedOff {
		t.Errorf("after shutdown committed %d %q, want 8 %q", off, meta, commitHandedOff)
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_ops_total", "kind=count", "outcome=incr"); got != 1 {
		t.Errorf("count/incr ops = %v, want 1", got)
	}
}

// TestNoCommitWithoutMemcached checks that nothing is committed while
// memcached cannot be reached, and that a member with memcached resumes
// where it stopped.
func TestNoCommitWithoutMemcached(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)
	down := newRig(t, daemonRules, rigOptions{mcAddr: testsvc.ClosedAddr(t)})
	produce(t, brokers, topic,
		debezium("c", "shop", "users", nil, row("id", 1)),
		debezium("c", "shop", "users", nil, row("id", 2)),
		debezium("u", "shop", "users", row("id", 1), row("id", 1)),
	)
	d, stop := down.daemon(brokers, group, topic)
	waitFor(t, 20*time.Second, func() string {
		if n := testsvc.Metric(t, down.reg, "cachewarden_apply_retries_total"); n < 3 {
			return fmt.Sprintf("%v apply retries, want 3", n)
		}
		return ""
	})
	if d.Ready() {
		t.Errorf("ready although memcached is unreachable")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if off := committed(t, brokers, group, topic, 0)[0]; off >= 0 {
		t.Fatalf("offset %d committed although nothing was applied", off)
	}

	// Same group, same keys (the prefix), memcached up: all three apply.
	up := newRig(t, daemonRules, rigOptions{prefix: down.prefix})
	up.set("ns:user:1", "5")
	_, stop2 := up.daemon(brokers, group, topic)
	waitCommitted(t, brokers, group, topic, 3)
	if got := up.get("ns:user:1"); got != "6" {
		t.Errorf("ns:user:1 = %q, want 6 (two bumps of one batch coalesce)", got)
	}
	if got := up.get("ns:user:2"); got == "<missing>" {
		t.Errorf("ns:user:2 not bumped")
	}
	if err := stop2(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPoisonGoesToDLQ checks the DLQ records and their headers, and that
// the partition moves on past poison messages.
func TestPoisonGoesToDLQ(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	dlqTopic := "dlq-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic, dlqTopic)
	dlq, err := NewDLQ(KafkaConn{Brokers: brokers}, dlqTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	r := newRig(t, daemonRules, rigOptions{poison: dlq})
	r.set("ns:user:3", "1")

	undecodable := kafka.Message{Key: []byte("k1"), Value: []byte(`{"op":"c","after":{"id":`),
		Headers: []kafka.Header{{Key: "trace", Value: []byte("abc")}}}
	missingKey := debezium("c", "shop", "users", nil, row("name", "no id"))
	produce(t, brokers, topic,
		debezium("c", "shop", "users", nil, row("id", 3)),
		undecodable,
		missingKey,
		debezium("u", "shop", "users", row("id", 3), row("id", 3)),
	)
	_, stop := r.daemon(brokers, group, topic)
	waitCommitted(t, brokers, group, topic, 4)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.get("ns:user:3"); got != "2" {
		t.Errorf("ns:user:3 = %q, want 2: the good events around the poison apply", got)
	}

	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: dlqTopic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer reader.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	want := []struct {
		value  []byte
		offset string
		errSub string
	}{
		{undecodable.Value, "1", "decode"},
		{missingKey.Value, "2", `column "id" missing`},
	}
	for i, w := range want {
		m, err := reader.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("DLQ record %d: %v", i, err)
		}
		if string(m.Value) != string(w.value) {
			t.Errorf("DLQ record %d value = %q, want %q", i, m.Value, w.value)
		}
		h := map[string]string{}
		for _, hd := range m.Headers {
			h[hd.Key] = string(hd.Value)
		}
		if h[HeaderTopic] != topic || h[HeaderPartition] != "0" || h[HeaderOffset] != w.offset {
			t.Errorf("DLQ record %d headers = %v, want topic %s partition 0 offset %s", i, h, topic, w.offset)
		}
		if !strings.Contains(h[HeaderError], w.errSub) {
			t.Errorf("DLQ record %d error header %q does not mention %q", i, h[HeaderError], w.errSub)
		}
		if i == 0 && (h["trace"] != "abc" || string(m.Key) != "k1") {
			t.Errorf("DLQ record lost the original key or headers: key %q headers %v", m.Key, h)
		}
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_dlq_messages_total", "topic="+topic); got != 2 {
		t.Errorf("DLQ messages metric = %v, want 2", got)
	}
}

// TestShutdownAppliesDelayedBumps checks that pending delayed bumps are
// applied when the daemon stops, and that they never held the commit.
func TestShutdownAppliesDelayedBumps(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)
	r := newRig(t, rebumpRules, rigOptions{})
	r.set("ns:user:5", "40")
	produce(t, brokers, topic, debezium("u", "shop", "users", row("id", 5), row("id", 5)))
	_, stop := r.daemon(brokers, group, topic)
	waitCommitted(t, brokers, group, topic, 1)
	if got := r.get("ns:user:5"); got != "41" {
		t.Fatalf("ns:user:5 = %q before shutdown, want 41 (first bump only)", got)
	}
	if n := r.rebump.Pending(); n != 1 {
		t.Fatalf("%d pending delayed bumps, want 1", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.get("ns:user:5"); got != "42" {
		t.Errorf("ns:user:5 = %q after shutdown, want 42 (the delayed bump applied)", got)
	}
	if n := r.rebump.Pending(); n != 0 {
		t.Errorf("%d delayed bumps still pending", n)
	}
}

// TestPartitionsConsumedIndependently spreads keys over partitions and
// checks each partition's commit.
func TestPartitionsConsumedIndependently(t *testing.T) {
	topic := "cdc-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 3, topic)
	r := newRig(t, daemonRules, rigOptions{})
	var msgs []kafka.Message
	for id := range 30 {
		m := debezium("c", "shop", "users", nil, row("id", id))
		m.Key = []byte(strconv.Itoa(id))
		msgs = append(msgs, m)
	}
	produce(t, brokers, topic, msgs...)
	_, stop := r.daemon(brokers, group, topic)
	waitFor(t, 20*time.Second, func() string {
		offs := committed(t, brokers, group, topic, 0, 1, 2)
		var total int64
		for _, o := range offs {
			total += max(o, 0)
		}
		if total != 30 {
			return fmt.Sprintf("committed %v (total %d), want 30 messages", offs, total)
		}
		return ""
	})
	for id := range 30 {
		if r.get("ns:user:"+strconv.Itoa(id)) == "<missing>" {
			t.Errorf("ns:user:%d not bumped", id)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRebalance adds a second member to a running group: partitions move,
// every message is applied, and since the first member handed the moved
// partition over cleanly, the second applies its counter deltas as they
// come instead of recounting.
func TestRebalance(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	topic := "cdc-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 2, topic)
	a := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	b := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn, prefix: a.prefix})
	createComments(t, db, 1, 4)
	createComments(t, db, 2, 6)

	// Keys "1" and "2" land on different partitions of two.
	comment := func(post int) kafka.Message {
		m := debezium("c", "blog", "comments", nil, row("id", 1, "post_id", post))
		m.Key = []byte(strconv.Itoa(post))
		return m
	}
	produce(t, brokers, topic, comment(1), comment(2))
	da, stopA := a.daemon(brokers, group, topic)
	waitFor(t, 20*time.Second, func() string {
		offs := committed(t, brokers, group, topic, 0, 1)
		if offs[0] < 1 || offs[1] < 1 {
			return fmt.Sprintf("committed %v", offs)
		}
		return ""
	})
	if a.get("comments:1") != "4" || a.get("comments:2") != "6" {
		t.Fatalf("after the first member's first batches: comments:1=%s comments:2=%s, want 4 and 6", a.get("comments:1"), a.get("comments:2"))
	}

	db_, stopB := b.daemon(brokers, group, topic)
	waitFor(t, 30*time.Second, func() string {
		na, nb := metricValue(a.metrics.assigned), metricValue(b.metrics.assigned)
		if na != 1 || nb != 1 {
			return fmt.Sprintf("assignments %v and %v, want one partition each", na, nb)
		}
		return ""
	})
	// Both counters are now correct in memcached and MySQL agrees; each
	// new delta is applied once, whoever owns its partition.
	createComments(t, db, 1, 1)
	createComments(t, db, 2, 1)
	produce(t, brokers, topic, comment(1), comment(2))
	waitFor(t, 20*time.Second, func() string {
		offs := committed(t, brokers, group, topic, 0, 1)
		if offs[0]+offs[1] != 4 {
			return fmt.Sprintf("committed %v, want 2 messages per partition", offs)
		}
		return ""
	})
	if a.get("comments:1") != "5" || a.get("comments:2") != "7" {
		t.Errorf("comments:1=%s comments:2=%s, want 5 and 7", a.get("comments:1"), a.get("comments:2"))
	}
	// The partition the second member took was handed over cleanly.
	if n := testsvc.Metric(t, b.reg, "cachewarden_recounts_total", "reason=reassigned"); n != 0 {
		t.Errorf("second member's reassigned recounts = %v, want 0 after a clean handoff", n)
	}
	if n := metricValue(a.metrics.handoffs.WithLabelValues("clean")); n != 1 {
		t.Errorf("first member's clean handoffs = %v, want 1", n)
	}
	if !da.Ready() || !db_.Ready() {
		t.Errorf("members not ready after the rebalance")
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
}
