package counters

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// TestRecountsOfOneApplyTogether: the recounts of one Apply share one
// snapshot and one gets, and store their fences and values together:
// pipelined with Config.Servers (one exchange each), else one text
// request per item; each counter ends exact with a consistent fence.
func TestRecountsOfOneApplyTogether(t *testing.T) {
	b := newBinlogDB(t)
	for _, tc := range []struct {
		name      string
		pipelined bool
		// calls is the memcached requests of the Apply below: the gets,
		// the fences, the values, and the other key's incr.
		calls uint64
		// oneByOne: the recounter takes no recounts together
		// (SnapshotBatchCounter): each asks for a snapshot of its own.
		oneByOne bool
	}{
		{"pipelined", true, 1 + 1 + 1 + 1, false},
		{"text", false, 1 + 5 + 5 + 1, false},
		{"one snapshot ask each", true, 1 + 1 + 1 + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := Config{}
			if tc.pipelined {
				var servers memcache.ServerList
				if err := servers.SetServers(e.addr); err != nil {
					t.Fatal(err)
				}
				cfg.Servers = &servers
			}
			var rc Recounter = b.m
			if tc.oneByOne {
				rc = snapshotsOnly{b.m}
			}
			c := New(e.mc, rc, cfg, nil)
			t.Cleanup(c.Close)
			posts := []int{21, 22, 23, 24, 25}
			if tc.oneByOne {
				posts = []int{41, 42, 43, 44, 45}
			}
			var ops []rules.Op
			for i, post := range posts {
				for range i % 3 {
					b.insert(post)
				}
				k := e.key("comments:" + strconv.Itoa(post))
				if i%2 == 0 {
					e.set(k, "40") // an older, wrong value
				}
				ops = append(ops, recountOp(k, strconv.Itoa(post)))
			}
			other := e.key("comments:" + strconv.Itoa(posts[0]+5))
			e.set(other, "7")
			ops = append(ops, countOp(other, 1, strconv.Itoa(posts[0]+5)))

			snapshots, calls := b.m.SnapshotsTaken(), c.Stats().Calls
			wantOutcomes(t, apply(t, c, ops...), cacheops.OutcomeRecounted, cacheops.OutcomeRecounted,
				cacheops.OutcomeRecounted, cacheops.OutcomeRecounted, cacheops.OutcomeRecounted, cacheops.OutcomeIncr)
			if n := c.Stats().Calls - calls; n != tc.calls {
				t.Errorf("%d memcached requests, want %d", n, tc.calls)
			}
			for _, post := range posts {
				k := e.key("comments:" + strconv.Itoa(post))
				e.wantExact(b, k, post)
				if v := e.view(c, k); !v.Consistent() {
					t.Fatalf("%s: %+v, want a consistent fence", k, v)
				}
			}
			if v := e.value(other); v != "8" {
				t.Fatalf("%s = %s, want 8", other, v)
			}
			if n := b.m.SnapshotsTaken() - snapshots; n != 1 && !tc.oneByOne {
				t.Errorf("%d snapshots, want 1 for the 5 recounts", n)
			}
			if s := c.Stats(); s.Recounts != 5 || s.FencedRecounts != 5 {
				t.Errorf("stats = %+v, want 5 fenced recounts", s)
			}
		})
	}
}

// snapshotsOnly is a SnapshotCounter that takes no recounts together.
type snapshotsOnly struct{ m *MySQL }

func (s snapshotsOnly) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	return s.m.Count(ctx, query, args)
}

func (s snapshotsOnly) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts SnapshotOptions) (SnapshotCount, error) {
	return s.m.CountInSnapshot(ctx, query, args, opts)
}

// racingBatch runs race once, right after the first recounts taken
// together: what another writer does between their counts and their
// stores.
type racingBatch struct {
	*MySQL
	once sync.Once
	race func()
}

func (r *racingBatch) CountAllInSnapshot(ctx context.Context, qs []SnapshotQuery, opts SnapshotOptions) ([]SnapshotCount, []error) {
	counts, errs := r.MySQL.CountAllInSnapshot(ctx, qs, opts)
	r.once.Do(r.race)
	return counts, errs
}

// TestRecountsTogetherRetryWhenDeltaLands: a delta that lands on one of
// the counters between the recounts' gets and their stores fails that
// counter's cas, and it is counted again; a counter created meanwhile
// fails its add likewise. Neither change is lost.
func TestRecountsTogetherRetryWhenDeltaLands(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	present, missing, calm := e.key("comments:31"), e.key("comments:32"), e.key("comments:33")
	b.insert(31)
	b.insert(33)
	e.set(present, "40")
	e.set(calm, "40")
	rc := &racingBatch{MySQL: b.m, race: func() {
		b.insert(31)
		if _, err := e.mc.Increment(present, 1); err != nil {
			t.Error(err)
		}
		b.insert(32)
		e.set(missing, "9") // a writer's wrong value, created meanwhile
	}}
	var servers memcache.ServerList
	if err := servers.SetServers(e.addr); err != nil {
		t.Fatal(err)
	}
	c := New(e.mc, rc, Config{Servers: &servers}, nil)
	t.Cleanup(c.Close)
	wantOutcomes(t, apply(t, c, recountOp(present, "31"), recountOp(missing, "32"), recountOp(calm, "33")),
		cacheops.OutcomeRecounted, cacheops.OutcomeRecounted, cacheops.OutcomeRecounted)
	e.wantExact(b, present, 31)
	e.wantExact(b, missing, 32)
	e.wantExact(b, calm, 33)
	if s := c.Stats(); s.Recounts != 5 {
		t.Fatalf("recounts = %d, want 5 (two stores lost)", s.Recounts)
	}
}

// TestRecountsOfOneQueryCombined: a snapshot runs the recounts of one
// query together, several to a statement, and each count is its own
// post's; a query that cannot be combined (here a trailing comment would
// swallow the rest of the combined statement) runs alone, as exact.
func TestRecountsOfOneQueryCombined(t *testing.T) {
	b := newBinlogDB(t)
	commented := *countRule
	commented.Query += " -- per post"
	for _, tc := range []struct {
		name     string
		rule     *rules.Rule
		combined bool
	}{
		{"combinable", countRule, true},
		{"commented", &commented, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := New(e.mc, b.m, Config{}, nil)
			var ops []rules.Op
			var posts []int
			for i := range 21 { // 16 + 4 + 1
				post := 100 + i
				if tc.name == "commented" {
					post += 100
				}
				posts = append(posts, post)
				for range i % 4 {
					b.insert(post)
				}
				op := recountOp(e.key("comments:"+strconv.Itoa(post)), strconv.Itoa(post))
				op.Rule = tc.rule
				ops = append(ops, op)
			}
			snapshots := b.m.SnapshotsTaken()
			apply(t, c, ops...)
			for _, post := range posts {
				e.wantExact(b, e.key("comments:"+strconv.Itoa(post)), post)
			}
			if n := b.m.SnapshotsTaken() - snapshots; n != 1 {
				t.Errorf("%d snapshots, want 1", n)
			}
			if _, refused := b.m.noCombine.Load(tc.rule.Query); refused == tc.combined {
				t.Errorf("query refused combined: %v, want %v", refused, !tc.combined)
			}
		})
	}
}
