package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/config"
)

// The pool tests: how the daemon behaves when a memcached pool, or one
// server of a pool, stops answering for a while and comes back still
// holding its items (SIGSTOP and SIGCONT: a network cut, not a restart).

const poolRules = "version: 1\nrules:\n  - name: item-ns\n    table: shop.items\n    on: [insert, update]\n    bump: \"ns:{name}\"\n"

// poolDaemon writes a config for one daemon (its own group) over servers
// and starts it.
func poolDaemon(t *testing.T, ctx context.Context, b *Broker, group, topic string, servers []string) *Daemon {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(poolRules), 0o644); err != nil {
		t.Fatal(err)
	}
	var quoted []string
	for _, s := range servers {
		quoted = append(quoted, strconv.Quote(s))
	}
	text := fmt.Sprintf("kafka:\n  brokers: [%q]\n  group: %q\n  topics: [%q]\nmemcached:\n  servers: [%s]\n  timeout: 200ms\n"+
		"rules: [rules.yaml]\nhttp:\n  listen: \"127.0.0.1:0\"\n", b.Addrs()[0], group, topic, strings.Join(quoted, ", "))
	return startDaemonYAML(t, ctx, filepath.Join(dir, "cachewarden.yaml"), text)
}

// startDaemonYAML writes a daemon config to path, loads it and starts an
// in-process daemon, stopped when the test ends if not before.
func startDaemonYAML(t *testing.T, ctx context.Context, path, text string) *Daemon {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config:\n%v\n%s", err, text)
	}
	d, err := StartDaemon(ctx, cfg, testLog(t), FastGroupTiming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop() })
	return d
}

// debeziumChange is a Debezium change event of shop.items for topic.
func debeziumChange(topic, op string, key []byte, before, after map[string]any) OutMessage {
	b, _ := json.Marshal(before)
	a, _ := json.Marshal(after)
	return OutMessage{Topic: topic, Key: key, Value: fmt.Appendf(nil,
		`{"before":%s,"after":%s,"source":{"db":"shop","table":"items"},"op":%q,"ts_ms":1}`, b, a, op)}
}

// publishUpdates publishes one update per name to topic.
func publishUpdates(t *testing.T, ctx context.Context, b *Broker, topic string, names []string) {
	t.Helper()
	var msgs []OutMessage
	for _, n := range names {
		row := map[string]any{"name": n}
		msgs = append(msgs, debeziumChange(topic, "u", []byte(n), row, row))
	}
	pub, err := NewPublisher(b.Addrs(), Debezium, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.PublishRaw(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// seedNamespaces stores version 1 for every name through mc and returns
// the keys.
func seedNamespaces(t *testing.T, mc *memcache.Client, names []string) []string {
	t.Helper()
	var keys []string
	for _, n := range names {
		key := "ns:" + n
		if err := mc.Set(&memcache.Item{Key: key, Value: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	return keys
}

// staleKeys returns the keys whose version is still 1 (not bumped) or
// that fail to read.
func staleKeys(mc *memcache.Client, keys []string) []string {
	var stale []string
	for _, k := range keys {
		it, err := mc.Get(k)
		if err != nil || strings.TrimSpace(string(it.Value)) == "1" {
			stale = append(stale, k)
		}
	}
	return stale
}

func poolNames(tag string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", tag, i)
	}
	return names
}

// TestPoolsOneDaemonEach: two pools (say, two zones), one daemon and one
// consumer group each, the same topic. Pool B stops answering for a
// while; pool A is kept current meanwhile; B is current again after it
// returns; neither keeps a stale item.
func TestPoolsOneDaemonEach(t *testing.T) {
	ctx := context.Background()
	a, bpool := startMemcached(t), startMemcached(t)
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const topic = "pools"
	if err := b.CreateTopics(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	mcA, mcB := memcache.New(a.addr), memcache.New(bpool.addr)
	names := poolNames("pool", 200)
	keysA, keysB := seedNamespaces(t, mcA, names), seedNamespaces(t, mcB, names)

	poolDaemon(t, ctx, b, "cw-pool-a", topic, []string{a.addr})
	poolDaemon(t, ctx, b, "cw-pool-b", topic, []string{bpool.addr})

	bpool.Signal(syscall.SIGSTOP)
	publishUpdates(t, ctx, b, topic, names)
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.WaitCaughtUp(waitCtx, "cw-pool-a", 50*time.Millisecond, topic); err != nil {
		t.Fatalf("pool A's daemon did not keep up while pool B was down: %v", err)
	}
	if stale := staleKeys(mcA, keysA); len(stale) > 0 {
		t.Errorf("pool A: %d stale items while pool B was down, e.g. %s", len(stale), stale[0])
	}
	lag, err := b.GroupLag(ctx, "cw-pool-b", topic)
	if err != nil {
		t.Fatal(err)
	}
	if lag.Total == 0 {
		t.Errorf("pool B's group committed while its memcached was stopped: invalidations were skipped")
	}
	t.Logf("pool B down: pool A current (%d keys), pool B's group %d messages behind", len(keysA), lag.Total)

	bpool.Signal(syscall.SIGCONT)
	if err := b.WaitCaughtUp(waitCtx, "cw-pool-b", 50*time.Millisecond, topic); err != nil {
		t.Fatalf("pool B's daemon did not catch up after it returned: %v", err)
	}
	if stale := staleKeys(mcB, keysB); len(stale) > 0 {
		t.Errorf("pool B: %d stale items after it returned, e.g. %s", len(stale), stale[0])
	}
	if stale := staleKeys(mcA, keysA); len(stale) > 0 {
		t.Errorf("pool A: %d stale items at the end", len(stale))
	}
}

// TestPoolServerCut: one server of three stops answering (a network cut:
// SIGSTOP, so it keeps its items) while changes flow. The partitions wait,
// nothing is committed past an invalidation the cut server did not get,
// and once it answers again every key on all three servers is current: no
// stale item outlives the cut by more than the retry and catch-up.
func TestPoolServerCut(t *testing.T) {
	ctx := context.Background()
	var procs []*memcachedProc
	var servers []string
	for range 3 {
		p := startMemcached(t)
		procs = append(procs, p)
		servers = append(servers, p.addr)
	}
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const topic = "cut"
	if err := b.CreateTopics(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	var list memcache.ServerList
	if err := list.SetServers(servers...); err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(&list)
	mc.Timeout = 200 * time.Millisecond
	names := poolNames("cut", 300)
	keys := seedNamespaces(t, mc, names)
	onCut := map[string]bool{}
	for _, k := range keys {
		if addr, _ := list.PickServer(k); addr.String() == servers[2] {
			onCut[k] = true
		}
	}
	poolDaemon(t, ctx, b, "cw-cut", topic, servers)

	procs[2].Signal(syscall.SIGSTOP)
	cutAt := time.Now()
	publishUpdates(t, ctx, b, topic, names)
	time.Sleep(2 * time.Second) // the cut lasts at least this long
	lag, err := b.GroupLag(ctx, "cw-cut", topic)
	if err != nil {
		t.Fatal(err)
	}
	if lag.Total == 0 {
		t.Fatalf("the group committed every message while a server was cut off: %d keys' invalidations were skipped", len(onCut))
	}
	var healthyKeys []string
	for _, k := range keys {
		if !onCut[k] {
			healthyKeys = append(healthyKeys, k)
		}
	}
	healthy := len(healthyKeys)
	healthyStale := len(staleKeys(mc, healthyKeys))
	procs[2].Signal(syscall.SIGCONT)
	returnedAt := time.Now()
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.WaitCaughtUp(waitCtx, "cw-cut", 20*time.Millisecond, topic); err != nil {
		t.Fatalf("no catch-up after the server returned: %v", err)
	}
	caughtUp := time.Since(returnedAt)
	if stale := staleKeys(mc, keys); len(stale) > 0 {
		t.Errorf("%d stale items after the cut server returned, e.g. %s", len(stale), stale[0])
	}
	t.Logf("cut %v: %d messages held uncommitted (%d keys on the cut server, %d on the healthy ones, %d of those still stale during the cut); every key current %v after it returned",
		returnedAt.Sub(cutAt).Round(time.Millisecond), lag.Total, len(onCut), healthy, healthyStale, caughtUp.Round(time.Millisecond))
}
