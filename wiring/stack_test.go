package wiring

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/pipeline"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// TestConfigFormatsParse keeps the config's list of formats and the
// decoders' names in step.
func TestConfigFormatsParse(t *testing.T) {
	for _, name := range decode.Names() {
		f, err := decode.ParseFormat(name)
		if err != nil || f.String() != name {
			t.Errorf("config format %q: decode.ParseFormat = %v, %v", name, f, err)
		}
	}
}

func TestNewStack(t *testing.T) {
	mc := testsvc.Memcached(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("version: 1\nrules:\n  - name: u\n    table: shop.users\n    bump: \"ns:{id}\"\n"), 0o644)
	path := filepath.Join(dir, "cw.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf(`kafka:
  brokers: [127.0.0.1:9092]
  group: g
  topics: [cdc, flat]
  topic_formats: {flat: debezium-flat}
  topic_tables: {flat: shop.users}
  dlq_topic: dead
memcached:
  servers: [%s]
  max_concurrency: 4
rules: [rules.yaml]
batch: {max_events: 77, max_wait: 5ms}
`, mc)), 0o644)
	cfg, err := config.LoadEnv(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStack(cfg, nil, StackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dc := s.DaemonConfig()
	if dc.Group != "g" || !slices.Equal(dc.Topics, []string{"cdc", "flat"}) || dc.MaxEvents != 77 || dc.MaxWait != 5*time.Millisecond ||
		!slices.Equal(dc.Kafka.Brokers, []string{"127.0.0.1:9092"}) || dc.Kafka.ClientID != "cachewarden" {
		t.Errorf("DaemonConfig = %+v", dc)
	}
	if s.MySQL != nil {
		t.Errorf("MySQL pool without a DSN")
	}
	if s.DLQ == nil || s.DLQ.Topic() != "dead" {
		t.Errorf("DLQ = %v", s.DLQ)
	}
	if f := s.Pipeline.DecoderFor("flat"); f.Format != decode.FormatDebeziumFlat || f.TopicTables["flat"] != "shop.users" {
		t.Errorf("decoder of topic flat = %+v", f)
	}
	if f := s.Pipeline.DecoderFor("cdc"); f.Format != decode.FormatAuto {
		t.Errorf("decoder of topic cdc = %+v", f)
	}
	if err := s.Memcache.Ping(); err != nil {
		t.Errorf("memcached client: %v", err)
	}
	// A bump through the stack's applier is timed as a memcached round
	// trip.
	bump := []rules.Op{{Kind: rules.OpBump, Rule: cfg.RuleSet.Rules()[0], Key: "ns:" + testsvc.Unique()}}
	if err := s.Applier.Apply(t.Context(), bump, make([]cacheops.Result, 1)); err != nil {
		t.Fatal(err)
	}
	mfs, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if mf.GetName() == "cachewarden_memcached_round_trip_duration_seconds" {
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n == 0 {
				t.Errorf("no memcached round trip observed after a bump")
			}
		}
	}
	if !slices.Contains(names, "cachewarden_memcached_round_trip_duration_seconds") {
		t.Errorf("registry lacks the memcached round-trip histogram")
	}
	for _, want := range []string{"cachewarden_memcached_requests_total", "cachewarden_ready", "go_goroutines", "cachewarden_batch_messages"} {
		if !slices.Contains(names, want) {
			t.Errorf("registry lacks %s", want)
		}
	}
	if d, err := s.NewDaemon(dc); err != nil || d.Ready() {
		t.Errorf("NewDaemon = %v, %v (ready before running?)", d, err)
	}
	noDLQ, err := NewStack(cfg, nil, StackOptions{NoDLQ: true})
	if err != nil {
		t.Fatal(err)
	}
	defer noDLQ.Close()
	if noDLQ.DLQ != nil || noDLQ.Pipeline.Config().Poison != nil {
		t.Errorf("NoDLQ stack has a DLQ")
	}
}

// TestNewStackBinlogSource: a config with source: binlog and no kafka
// section (as README shows it) builds a stack.
func TestNewStackBinlogSource(t *testing.T) {
	mc := testsvc.Memcached(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("version: 1\nrules:\n  - name: u\n    table: shop.users\n    bump: \"ns:{id}\"\n"), 0o644)
	path := filepath.Join(dir, "cw.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf("source: binlog\nbinlog:\n  dsn: \"u:p@tcp(%s)/\"\n  server_id: 4242\nmemcached:\n  servers: [%s]\nrules: [rules.yaml]\n",
		testsvc.ClosedAddr(t), mc)), 0o644)
	cfg, err := config.LoadEnv(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStack(cfg, nil, StackOptions{})
	if err != nil {
		t.Fatalf("NewStack with source: binlog and no kafka section: %v", err)
	}
	s.Close()
}

// TestStackOneApplier: with either memcached.protocol, the stack's one
// Applier applies every kind the pipeline, the delayed bumps and replay
// send it: bumps, replay's set rebuilds and deletes, counter deltas.
func TestStackOneApplier(t *testing.T) {
	mc := testsvc.Memcached(t)
	for _, protocol := range []string{"meta", "text"} {
		t.Run(protocol, func(t *testing.T) {
			cfg := loadStackConfig(t, `version: 1
rules:
  - name: u
    table: shop.users
    bump: "ns:{id}"
  - name: tags
    table: shop.tags
    set:
      key: "tags:{user_id}"
      member: "{tag}"
  - name: comments
    table: shop.comments
    count:
      key: "comments:{post_id}"
`, fmt.Sprintf(`kafka: {brokers: [127.0.0.1:9092], group: g, topics: [cdc]}
memcached: {servers: [%s], protocol: %s}
rules: [rules.yaml]
`, mc, protocol))
			s, err := NewStack(cfg, nil, StackOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rs := cfg.RuleSet.Rules()
			prefix := "cwstack:" + testsvc.Unique() + ":"
			set, counter, missing := prefix+"tags:1", prefix+"comments:1", prefix+"comments:2"
			for key, value := range map[string]string{set: "+old ", counter: "10"} {
				if err := s.Memcache.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
					t.Fatal(err)
				}
			}
			ops := []rules.Op{
				{Kind: rules.OpBump, Rule: rs[0], Key: prefix + "ns:1"},
				{Kind: rules.OpSetRebuild, Rule: rs[1], Key: set},
				{Kind: rules.OpSetDelete, Rule: rs[1], Key: prefix + "tags:2"},
				{Kind: rules.OpCount, Rule: rs[2], Key: counter, Delta: 2},
				{Kind: rules.OpCount, Rule: rs[2], Key: missing, Delta: 1},
			}
			results := make([]cacheops.Result, len(ops))
			if err := s.Applier.Apply(t.Context(), ops, results); err != nil {
				t.Fatal(err)
			}
			want := []cacheops.Outcome{cacheops.OutcomeAdded, cacheops.OutcomeDeleted, cacheops.OutcomeDeleted,
				cacheops.OutcomeIncr, cacheops.OutcomeMissing}
			for i, r := range results {
				if r.Outcome != want[i] {
					t.Errorf("%s: %v, want %v", ops[i].Kind, r.Outcome, want[i])
				}
			}
			// Without a load query the rebuilt set is deleted.
			if _, err := s.Memcache.Get(set); err != memcache.ErrCacheMiss {
				t.Errorf("rebuilt set: %v, want it deleted", err)
			}
			if it, err := s.Memcache.Get(counter); err != nil || string(it.Value) != "12" {
				t.Errorf("counter after +2: %v, %v; want 12", it, err)
			}
		})
	}
}

// loadStackConfig writes ruleFile as rules.yaml and configFile beside it,
// and loads the config.
func loadStackConfig(t *testing.T, ruleFile, configFile string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(ruleFile), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cw.yaml")
	if err := os.WriteFile(path, []byte(configFile), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadEnv(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestStackObserveOnly: the stack of `cachewarden observe` builds no
// counters (it recounts nothing, so counters.fencing: required asks
// nothing of the database, which may even be down at start), no DLQ, no
// delayed bumps and no fences, and what its pipeline applies reaches no
// memcached item.
func TestStackObserveOnly(t *testing.T) {
	mc := testsvc.Memcached(t)
	// A port nothing listens on: observe must not need the database to
	// start.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	cfg := loadStackConfig(t, `version: 1
rules:
  - name: u
    table: shop.users
    bump: "ns:{id}"
    rebump_after: 1s
  - name: tags
    table: shop.tags
    set:
      key: "tags:{user_id}"
      member: "{tag}"
      load: "SELECT tag FROM tags WHERE user_id = ?"
      args: [user_id]
  - name: comments
    table: shop.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      args: [post_id]
`, fmt.Sprintf(`kafka: {brokers: [127.0.0.1:9092], group: g, topics: [cdc], dlq_topic: dead}
memcached: {servers: [%s]}
mysql: {dsn: "root@tcp(%s)/shop", query_timeout: 1s}
counters: {fencing: required}
rules: [rules.yaml]
`, mc, down))
	if _, err := NewStack(cfg, nil, StackOptions{}); err == nil {
		t.Fatal("the daemon's stack started with counters.fencing: required and the database down")
	}
	s, err := NewStack(cfg, nil, StackOptions{ObserveOnly: true})
	if err != nil {
		t.Fatalf("observe stack: %v", err)
	}
	defer s.Close()
	pc := s.Pipeline.Config()
	if s.Counters != nil || pc.Counters != nil || pc.Fences != nil || pc.DeltasToWriter || pc.Rebump != nil || s.DLQ != nil || pc.Poison != nil {
		t.Errorf("observe stack: Counters %v, pipeline Counters %v, Fences %v, DeltasToWriter %v, Rebump %v, DLQ %v",
			s.Counters, pc.Counters, pc.Fences, pc.DeltasToWriter, pc.Rebump, s.DLQ)
	}
	rs := cfg.RuleSet.Rules()
	prefix := "cwobserve:" + testsvc.Unique() + ":"
	b := &pipeline.Batch{Ops: []rules.Op{
		{Kind: rules.OpBump, Rule: rs[0], Key: prefix + "ns:1"},
		{Kind: rules.OpSetAppend, Rule: rs[1], Key: prefix + "tags:1", Tokens: "+a "},
		{Kind: rules.OpSetDelete, Rule: rs[1], Key: prefix + "tags:2"},
		{Kind: rules.OpCount, Rule: rs[2], Key: prefix + "comments:1", Delta: 1},
		{Kind: rules.OpRecount, Rule: rs[2], Key: prefix + "comments:2"},
	}}
	if err := s.Memcache.Set(&memcache.Item{Key: prefix + "tags:2", Value: []byte("+b ")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Pipeline.Apply(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ns:1", "tags:1", "comments:1", "comments:2"} {
		if it, err := s.Memcache.Get(prefix + key); err != memcache.ErrCacheMiss {
			t.Errorf("%s: %v, %v; want it missing (observe writes nothing)", key, it, err)
		}
	}
	if it, err := s.Memcache.Get(prefix + "tags:2"); err != nil || string(it.Value) != "+b " {
		t.Errorf("tags:2: %v, %v; want it as it was", it, err)
	}
}
