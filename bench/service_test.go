package bench

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/twmb/franz-go/pkg/kfake"
)

// privateMemcached starts a memcached of the test's own: the harness
// empties the cache (flush_all), which a shared test server must not see.
func privateMemcached(t testing.TB) *Memcached {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		bin = "/usr/bin/memcached"
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("memcached binary not found: %v", err)
		}
		t.Skip("memcached binary not found; install memcached (apt-get install memcached) to run this test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := StartMemcached(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	return m
}

func TestSeedKeysAndStats(t *testing.T) {
	m := privateMemcached(t)
	mc := memcache.New(m.Addr)
	defer mc.Close()
	if err := mc.Set(&memcache.Item{Key: "stale", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := SeedKeys(m.Addr, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Get("stale"); err != memcache.ErrCacheMiss {
		t.Errorf("item from before the seed survived: %v", err)
	}
	for _, key := range []string{UserKey(1), UserKey(10), InterestsKey(5), CommentsKey(10)} {
		if _, err := mc.Get(key); err != nil {
			t.Errorf("seeded %s: %v", key, err)
		}
	}
	if _, err := mc.Get(UserKey(11)); err != memcache.ErrCacheMiss {
		t.Errorf("key outside the key space: %v", err)
	}
	it, err := mc.Get(CommentsKey(3))
	if err != nil || string(it.Value) != "1000" {
		t.Fatalf("counter seed: %v %v", it, err)
	}

	before, err := Stats(m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	segs0, _, segErr := m.SegmentsIn()
	mc.Increment(CommentsKey(3), 1)
	mc.Increment("missing", 1)
	mc.Append(&memcache.Item{Key: InterestsKey(3), Value: []byte("+9 ")})
	mc.GetMulti([]string{UserKey(1), UserKey(2), UserKey(3)})
	after, err := Stats(m.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// incr hit + incr miss + append + 3 keys of one multi-get.
	if got := after.Sub(before).CommandCount(); got != 6 {
		t.Errorf("commands counted: %d, want 6 (delta %v)", got, after.Sub(before))
	}
	// One request written per command, the multi-get included.
	if segErr != nil {
		t.Logf("requests not counted: %v", segErr)
	} else if segs1, conns, err := m.SegmentsIn(); err != nil || segs1-segs0 != 4 || conns == 0 {
		t.Errorf("requests counted: %d on %d connections (err %v), want 4", segs1-segs0, conns, err)
	}
}

// TestBaselineAppliesEvents runs each baseline consumer over generated
// events on an in-process broker and checks the cache it leaves behind
// against the events, and that it committed every offset.
func TestBaselineAppliesEvents(t *testing.T) {
	t.Run(ConsumerNaive, func(t *testing.T) {
		testBaselineApplies(t, func(ctx context.Context, brokers []string, topic, group, mc string) error {
			return RunBaseline(ctx, BaselineConfig{Brokers: brokers, Topic: topic, Group: group, Memcached: mc, Log: testLogger(t)})
		})
	})
	t.Run(ConsumerCompetent, func(t *testing.T) {
		testBaselineApplies(t, func(ctx context.Context, brokers []string, topic, group, mc string) error {
			return RunCompetent(ctx, CompetentConfig{Brokers: brokers, Topic: topic, Group: group, Memcached: mc, Workers: 8, Log: testLogger(t)})
		})
	})
}

func testBaselineApplies(t *testing.T, run func(ctx context.Context, brokers []string, topic, group, mc string) error) {
	m := privateMemcached(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := &Broker{Addrs: cluster.ListenAddrs()}
	const topic, partitions, n, keys = "bench-baseline-test", 2, 600, 8
	if err := b.CreateTopic(ctx, topic, partitions); err != nil {
		t.Fatal(err)
	}
	w := Workload{Dist: Zipf, Keys: keys, ZipfS: 1.3, Seed: 5}
	if _, err := Produce(ctx, b.Addrs, topic, w, n); err != nil {
		t.Fatal(err)
	}
	ends, err := b.EndOffsets(ctx, topic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	if ends[0]+ends[1] != n {
		t.Fatalf("end offsets %v, want %d messages", ends, n)
	}

	// What the events should do to the seeded cache.
	g, err := NewGenerator(w)
	if err != nil {
		t.Fatal(err)
	}
	bumps := map[string]int{}
	counters := map[string]int{}
	tokens := map[string]int{}
	for range n {
		_, v, _ := g.Next(nil, nil)
		op, ok, err := PlanNaive(v)
		if err != nil || !ok {
			t.Fatalf("PlanNaive: %v %v", ok, err)
		}
		switch op.Kind {
		case NaiveBump:
			bumps[op.Key]++
		case NaiveIncr:
			counters[op.Key]++
		case NaiveDecr:
			counters[op.Key]--
		case NaiveAppend:
			tokens[op.Key]++
		}
	}
	if err := SeedKeys(m.Addr, keys); err != nil {
		t.Fatal(err)
	}
	mc := memcache.New(m.Addr)
	defer mc.Close()
	seededVersion := map[string]int64{}
	for key := range bumps {
		it, err := mc.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		seededVersion[key], _ = strconv.ParseInt(string(it.Value), 10, 64)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, b.Addrs, topic, "bench-test", m.Addr)
	}()
	client := b.client()
	for {
		c, err := b.Committed(ctx, client, "bench-test", topic, partitions)
		if err == nil && c == n {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("baseline ended early: %v", err)
		case <-ctx.Done():
			t.Fatalf("baseline committed %d of %d: %v", c, n, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("RunBaseline: %v", err)
	}

	for key, delta := range counters {
		it, err := mc.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		// decr may leave the shorter number space-padded.
		if want := strconv.Itoa(1000 + delta); strings.TrimRight(string(it.Value), " ") != want {
			t.Errorf("%s = %s, want %s", key, it.Value, want)
		}
	}
	for key, count := range bumps {
		it, err := mc.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.FormatInt(seededVersion[key]+int64(count), 10); string(it.Value) != want {
			t.Errorf("%s = %s, want %s", key, it.Value, want)
		}
	}
	for key, count := range tokens {
		it, err := mc.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		// Two seeded tokens plus one per event.
		if got := len(strings.Fields(string(it.Value))); got != 2+count {
			t.Errorf("%s holds %d tokens, want %d", key, got, 2+count)
		}
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}
