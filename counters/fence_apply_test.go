package counters

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// positioned returns a count op for post whose event sits at pos.
func positioned(key string, delta int64, post int, pos rules.Position) rules.Op {
	op := countOp(key, delta, strconv.Itoa(post))
	op.Source = pos
	return op
}

// applyAll runs Apply and returns the results; it fails the test when an op
// fails.
func applyAll(t testing.TB, c *Counters, ops []rules.Op) []cacheops.Result {
	t.Helper()
	results := make([]cacheops.Result, len(ops))
	if err := c.Apply(context.Background(), ops, results); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return results
}

// process runs a batch of uncoalesced count ops the way the pipeline
// does: check the fences, sum the kept deltas per key, apply, recheck and
// apply the recounts the recheck asks for.
func process(t testing.TB, c *Counters, d *DeltaFence, ops []rules.Op) {
	t.Helper()
	ctx := context.Background()
	kept, err := c.CheckDeltas(ctx, d, ops)
	if err != nil {
		t.Fatalf("CheckDeltas: %v", err)
	}
	summed := sumByKey(kept)
	results := applyAll(t, c, summed)
	recounts, err := c.RecheckDeltas(ctx, d, nil, summed, results)
	if err != nil {
		t.Fatalf("RecheckDeltas: %v", err)
	}
	if len(recounts) > 0 {
		applyAll(t, c, recounts)
	}
}

// sumByKey coalesces count ops as the pipeline does: one op per key, the
// deltas summed, a recount absorbing the key's deltas, the first op's
// source kept.
func sumByKey(ops []rules.Op) []rules.Op {
	var out []rules.Op
	index := map[string]int{}
	for _, op := range ops {
		i, ok := index[op.Key]
		if !ok {
			index[op.Key] = len(out)
			out = append(out, op)
			continue
		}
		if op.Kind == rules.OpRecount {
			out[i].Kind, out[i].Delta = rules.OpRecount, 0
		} else if out[i].Kind == rules.OpCount {
			out[i].Delta += op.Delta
		}
	}
	kept := out[:0]
	for _, op := range out {
		if op.Kind == rules.OpRecount || op.Delta != 0 {
			kept = append(kept, op)
		}
	}
	return kept
}

// view reads the counter at key and its fence.
func (e *env) view(c *Counters, key string) FenceView {
	e.t.Helper()
	views := map[string]FenceView{}
	if err := c.viewFences([]string{key}, views, nil); err != nil {
		e.t.Fatal(err)
	}
	return views[key]
}

func (e *env) wantExact(b *binlogDB, key string, post int) {
	e.t.Helper()
	want := strconv.FormatInt(b.count(post), 10)
	if got := e.value(key); got != want {
		e.t.Fatalf("counter %s = %s, want %s (COUNT(*))", key, got, want)
	}
}

func TestFencedRecountSkipsDeltasAtOrBeforeFence(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	if !c.Fencing() {
		t.Fatal("fencing is off with a MySQL recounter")
	}
	k := e.key("comments:1")
	early := b.insert(1)
	justBefore := b.insert(1)
	wantOutcomes(t, apply(t, c, recountOp(k, "1")), cacheops.OutcomeRecounted)
	v := e.view(c, k)
	if !v.Consistent() || e.value(k) != "2" {
		t.Fatalf("after the recount: %s with %+v, want 2 with a consistent fence", e.value(k), v)
	}
	fence := v.Fence.At
	if order, ok := ComparePositions(PositionOf(justBefore), fence); !ok || order >= 0 {
		t.Fatalf("the last insert before the recount (%v) is not before its fence %v", justBefore, fence)
	}
	later := b.insert(1)
	atFence := rules.Position{BinlogFile: fence.File, BinlogPos: fence.Pos}

	var d DeltaFence
	ops := []rules.Op{
		positioned(k, 1, 1, early),
		positioned(k, 1, 1, justBefore),
		positioned(k, 1, 1, atFence),
		positioned(k, 1, 1, later),
	}
	kept, err := c.CheckDeltas(context.Background(), &d, ops)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || kept[0].Source != later {
		t.Fatalf("kept %+v, want only the delta after the fence", kept)
	}
	if d.Stats.Checked != 4 || d.Stats.Skipped != 3 || d.Stats.Recounts != 0 {
		t.Fatalf("stats = %+v, want 4 checked, 3 skipped", d.Stats)
	}
	results := applyAll(t, c, kept)
	if recounts, err := c.RecheckDeltas(context.Background(), &d, nil, kept, results); err != nil || len(recounts) != 0 {
		t.Fatalf("RecheckDeltas = %v, %v; want nothing to recount", recounts, err)
	}
	e.wantExact(b, k, 1)
	if s := c.Stats(); s.FencedRecounts != 1 || s.UnfencedRecounts != 0 {
		t.Fatalf("stats = %+v, want one fenced recount", s)
	}
}

func TestFenceSharedBetweenInstances(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	other := memcache.New(e.addr)
	defer other.Close()
	c1 := New(e.mc, b.m, Config{}, nil)
	c2 := New(other, NewMySQL(b.db, DBConfig{}, nil), Config{}, nil)
	k := e.key("comments:2")
	inFlight := []rules.Position{b.insert(2), b.insert(2)}
	// The first daemon recounts (say, the new owner after a rebalance)...
	wantOutcomes(t, apply(t, c1, recountOp(k, "2")), cacheops.OutcomeRecounted)
	after := b.insert(2)
	// ...while the second still holds the older events, and a newer one.
	var d DeltaFence
	process(t, c2, &d, []rules.Op{positioned(k, 1, 2, inFlight[0]), positioned(k, 1, 2, inFlight[1]), positioned(k, 1, 2, after)})
	if d.Stats.Skipped != 2 {
		t.Fatalf("second instance skipped %d deltas, want the 2 its peer's recount includes", d.Stats.Skipped)
	}
	e.wantExact(b, k, 2)
}

func TestHalfWrittenRecountBecomesRecount(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:3")
	b.insert(3)
	wantOutcomes(t, apply(t, c, recountOp(k, "3")), cacheops.OutcomeRecounted)
	// A recount that wrote its fence and died before its value: the
	// fence claims rows the value does not hold.
	pos := b.insert(3)
	stale := Fence{At: BinlogPosition{File: pos.BinlogFile, Pos: pos.BinlogPos + 1}, ID: 4242}
	if err := c.storeFence(k, stale); err != nil {
		t.Fatal(err)
	}
	var d DeltaFence
	kept, err := c.CheckDeltas(context.Background(), &d, []rules.Op{positioned(k, 1, 3, pos)})
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || kept[0].Kind != rules.OpRecount || d.Stats.Recounts != 1 {
		t.Fatalf("kept %+v (stats %+v), want the delta turned into a recount", kept, d.Stats)
	}
	wantOutcomes(t, apply(t, c, kept...), cacheops.OutcomeRecounted)
	e.wantExact(b, k, 3)
	if v := e.view(c, k); !v.Consistent() || v.Fence.ID == stale.ID {
		t.Fatalf("after the recount %+v, want a fresh consistent fence", v)
	}
	// An unreadable fence is treated the same way.
	e.set(FenceKey(k), "garbage")
	kept, _ = c.CheckDeltas(context.Background(), &d, []rules.Op{positioned(k, 1, 3, b.insert(3))})
	if len(kept) != 1 || kept[0].Kind != rules.OpRecount {
		t.Fatalf("with a garbage fence kept %+v, want a recount", kept)
	}
}

func TestFencedMissStoresFenceFirst(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{FenceTTL: 2 * time.Minute}, nil)
	k := e.key("comments:4")
	pos := b.insert(4)
	wantOutcomes(t, apply(t, c, positioned(k, 1, 4, pos)), cacheops.OutcomeLoaded)
	e.wantExact(b, k, 4)
	v := e.view(c, k)
	if !v.Consistent() {
		t.Fatalf("after a loaded miss: %+v, want the value tied to its fence", v)
	}
	if order, ok := ComparePositions(PositionOf(pos), v.Fence.At); !ok || order >= 0 {
		t.Fatalf("the change at %v is not before the fence %v", pos, v.Fence.At)
	}
	if ttl := e.ttl(FenceKey(k)); ttl < 100 || ttl > 120 {
		t.Fatalf("fence TTL = %d, want FenceTTL's 2 minutes", ttl)
	}
	// The same event delivered again is skipped.
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 4, pos)})
	if d.Stats.Skipped != 1 {
		t.Fatalf("redelivered delta: stats %+v, want it skipped", d.Stats)
	}
	e.wantExact(b, k, 4)
}

// racingSnapshots runs race once, right after the first snapshot count:
// what another writer does between a recount and its store.
type racingSnapshots struct {
	*MySQL
	once sync.Once
	race func()
}

func (r *racingSnapshots) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts SnapshotOptions) (SnapshotCount, error) {
	sc, err := r.MySQL.CountInSnapshot(ctx, query, args, opts)
	r.once.Do(r.race)
	return sc, err
}

func TestFencedLostAddRace(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	winner := New(e.mc, NewMySQL(b.db, DBConfig{}, nil), Config{}, nil)

	t.Run("winner's recount includes the change", func(t *testing.T) {
		k := e.key("comments:5")
		pos := b.insert(5)
		rc := &racingSnapshots{MySQL: b.m, race: func() {
			wantOutcomes(t, apply(t, winner, recountOp(k, "5")), cacheops.OutcomeRecounted)
		}}
		c := New(e.mc, rc, Config{}, nil)
		// The old rule re-applied the delta and made this 2. Our fence
		// overwrote the winner's, so the value cannot be tied to a
		// fence any more: the loser recounts exactly.
		wantOutcomes(t, apply(t, c, positioned(k, 1, 5, pos)), cacheops.OutcomeRecounted)
		e.wantExact(b, k, 5)
		if v := e.view(c, k); !v.Consistent() {
			t.Fatalf("after the lost add: %+v, want a consistent fence", v)
		}
	})
	t.Run("winner stored an unfenced value", func(t *testing.T) {
		k := e.key("comments:6")
		pos := b.insert(6)
		rc := &racingSnapshots{MySQL: b.m, race: func() { e.set(k, "100") }}
		c := New(e.mc, rc, Config{}, nil)
		wantOutcomes(t, apply(t, c, positioned(k, 1, 6, pos)), cacheops.OutcomeRecounted)
		e.wantExact(b, k, 6)
		if v := e.view(c, k); !v.Consistent() {
			t.Fatalf("after the exact recount: %+v", v)
		}
	})
}

func TestExactRecountRetriesWhenDeltaLands(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	k := e.key("comments:7")
	b.insert(7)
	e.set(k, "40") // some older, wrong value
	// During the recount a row is inserted and its delta lands on the
	// counter: storing the recount with a plain set would lose it.
	rc := &racingSnapshots{MySQL: b.m, race: func() {
		b.insert(7)
		if _, err := e.mc.Increment(k, 1); err != nil {
			t.Error(err)
		}
	}}
	c := New(e.mc, rc, Config{}, nil)
	wantOutcomes(t, apply(t, c, recountOp(k, "7")), cacheops.OutcomeRecounted)
	e.wantExact(b, k, 7)
	if s := c.Stats(); s.Recounts != 2 {
		t.Fatalf("recounts = %d, want 2 (the first store lost its cas)", s.Recounts)
	}
}

func TestExactRecountGivesUpOnAlwaysChangingCounter(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	k := e.key("comments:8")
	e.set(k, "1")
	c := New(e.mc, &alwaysRacing{MySQL: b.m, mc: e.mc, key: k}, Config{}, nil)
	wantOutcomes(t, apply(t, c, recountOp(k, "8")), cacheops.OutcomeDeleted)
	if v := e.value(k); v != "<missing>" {
		t.Fatalf("counter = %s, want it deleted", v)
	}
	if s := c.Stats(); s.ExactRecountGiveUps != 1 || s.Recounts != maxExactAttempts {
		t.Fatalf("stats = %+v, want one give-up after %d recounts", s, maxExactAttempts)
	}
}

// alwaysRacing increments the counter during every recount.
type alwaysRacing struct {
	*MySQL
	mc  *memcache.Client
	key string
}

func (r *alwaysRacing) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts SnapshotOptions) (SnapshotCount, error) {
	sc, err := r.MySQL.CountInSnapshot(ctx, query, args, opts)
	r.mc.Increment(r.key, 1)
	return sc, err
}

// TestRecheckCatchesRacingRecount is the rebalance race: a daemon reads the
// fence and decides to apply a delta; before its incr lands, another
// daemon recounts (including that change) and stores a new fence; the incr
// then counts the change twice. The recheck sees the new fence and
// recounts.
func TestRecheckCatchesRacingRecount(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	other := New(e.mc, NewMySQL(b.db, DBConfig{}, nil), Config{}, nil)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:9")
	b.insert(9)
	wantOutcomes(t, apply(t, c, recountOp(k, "9")), cacheops.OutcomeRecounted)
	pos := b.insert(9)

	var d DeltaFence
	kept, err := c.CheckDeltas(context.Background(), &d, []rules.Op{positioned(k, 1, 9, pos)})
	if err != nil || len(kept) != 1 || kept[0].Kind != rules.OpCount {
		t.Fatalf("CheckDeltas = %+v, %v; want the delta kept", kept, err)
	}
	wantOutcomes(t, apply(t, other, recountOp(k, "9")), cacheops.OutcomeRecounted)
	results := applyAll(t, c, kept)
	if got, want := e.value(k), strconv.FormatInt(b.count(9)+1, 10); got != want {
		t.Fatalf("after the late incr: %s, want %s (the race counted the change twice)", got, want)
	}
	recounts, err := c.RecheckDeltas(context.Background(), &d, nil, kept, results)
	if err != nil || len(recounts) != 1 || recounts[0].Kind != rules.OpRecount || d.Stats.RecheckRecounts != 1 {
		t.Fatalf("RecheckDeltas = %+v, %v (stats %+v); want one recount", recounts, err, d.Stats)
	}
	applyAll(t, c, recounts)
	e.wantExact(b, k, 9)
}

func TestFencingFallbackWithoutBinlog(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	var on int
	if err := db.QueryRow("SELECT @@log_bin").Scan(&on); err != nil {
		t.Fatal(err)
	}
	if on == 1 {
		t.Skip("the server at CACHEWARDEN_TEST_MYSQL_DSN has its binary log on; this test needs one without")
	}
	var logs bytes.Buffer
	e := newEnv(t)
	c := New(e.mc, m, Config{}, slog.New(slog.NewTextHandler(&logs, nil)))
	addComments(t, db, 10, "ann", 2)
	k := e.key("comments:10")
	pos := rules.Position{BinlogFile: "mysql-bin.000001", BinlogPos: 100}
	wantOutcomes(t, apply(t, c, positioned(k, 1, 10, pos)), cacheops.OutcomeLoaded)
	wantOutcomes(t, apply(t, c, recountOp(k, "10")), cacheops.OutcomeRecounted)
	if v := e.value(k); v != "2" {
		t.Fatalf("counter = %s, want 2", v)
	}
	if _, err := e.mc.Get(FenceKey(k)); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("fence item: %v, want none without a binary log", err)
	}
	// Deltas are applied as without fences.
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 10, pos)})
	if v := e.value(k); v != "3" || d.Stats.Skipped != 0 {
		t.Fatalf("counter = %s (stats %+v), want 3: nothing to skip", v, d.Stats)
	}
	if s := c.Stats(); s.UnfencedRecounts != 2 || s.FencedRecounts != 0 {
		t.Fatalf("stats = %+v, want 2 unfenced recounts", s)
	}
	if n := strings.Count(logs.String(), "cannot be fenced"); n != 1 {
		t.Fatalf("logged the fallback %d times, want once:\n%s", n, logs.String())
	}
}

func TestDisableFences(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{DisableFences: true}, nil)
	if c.Fencing() {
		t.Fatal("Fencing() with DisableFences")
	}
	k := e.key("comments:11")
	pos := b.insert(11)
	wantOutcomes(t, apply(t, c, recountOp(k, "11")), cacheops.OutcomeRecounted)
	if v := e.view(c, k); v.HasFence || v.Flags != 0 {
		t.Fatalf("with fences disabled: %+v, want no fence", v)
	}
	var d DeltaFence
	kept, err := c.CheckDeltas(context.Background(), &d, []rules.Op{positioned(k, 1, 11, pos)})
	if err != nil || len(kept) != 1 || d.Stats.Checked != 0 {
		t.Fatalf("CheckDeltas = %+v, %v, stats %+v; want the delta untouched", kept, err, d.Stats)
	}
}

func TestGetStoresFence(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:12")
	pos := b.insert(12)
	if n, err := c.Get(context.Background(), k, commentsQuery, 12); err != nil || n != 1 {
		t.Fatalf("Get = %d, %v; want 1", n, err)
	}
	if v := e.view(c, k); !v.Consistent() {
		t.Fatalf("after a reader's recount: %+v, want a fenced value", v)
	}
	// A daemon holding the event skips it: the reader counted it.
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 12, pos)})
	if d.Stats.Skipped != 1 {
		t.Fatalf("stats = %+v, want the delta skipped", d.Stats)
	}
	e.wantExact(b, k, 12)
}

// TestFenceFlagsReadAsPlainNumbers: a fenced counter's flags use only
// bits 16-31, which php-memcached, pylibmc and pymemcache leave alone
// (client/readers_test.go reads such counters with each of them).
func TestFenceFlagsReadAsPlainNumbers(t *testing.T) {
	prev := uint32(0)
	for range 10000 {
		id := newFenceID(prev)
		if id == 0 || id&^itemformat.CounterFlagsMask != 0 || id == itemformat.ReaderCountFlags || id == prev {
			t.Fatalf("newFenceID(%#x) = %#x", prev, id)
		}
		prev = id
	}
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:14")
	wantOutcomes(t, apply(t, c, positioned(k, 1, 14, b.insert(14))), cacheops.OutcomeLoaded)
	if v := e.view(c, k); !v.Consistent() || v.Flags&^itemformat.CounterFlagsMask != 0 {
		t.Fatalf("fenced counter %+v: flags %#x use bits below 16", v, v.Flags)
	}
}

// TestReaderCountIsRecounted: a counter a reader recounted without a
// fence (client.Count stores it with itemformat.ReaderCountFlags) is
// recounted at the first delta rather than incremented, so a change the
// reader's count already held is not counted twice. The same counter
// stored with flags 0 takes the delta as without fences: counted twice.
func TestReaderCountIsRecounted(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	for _, tc := range []struct {
		name  string
		post  int
		flags uint32
		over  int64 // what the counter holds beyond the count after the delta
	}{{"reader count", 15, itemformat.ReaderCountFlags, 0}, {"flags 0", 16, 0, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			k := e.key("comments:" + strconv.Itoa(tc.post))
			pos := b.insert(tc.post)
			// The reader counts after the insert, before the daemon
			// applies its delta.
			n := b.count(tc.post)
			if err := e.mc.Set(&memcache.Item{Key: k, Value: strconv.AppendInt(nil, n, 10), Flags: tc.flags, Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			var d DeltaFence
			process(t, c, &d, []rules.Op{positioned(k, 1, tc.post, pos)})
			if got := e.value(k); got != strconv.FormatInt(n+tc.over, 10) {
				t.Fatalf("counter = %s after the delta; the row count is %d, want %d", got, n, n+tc.over)
			}
		})
	}
}

// TestDropLookalike: a reader's recount whose add lost finds its own
// fence over a counter with the same id (another recount drew it too):
// the pair only looks consistent, so the counter is deleted. Over a
// counter that matches another fence it does nothing.
func TestDropLookalike(t *testing.T) {
	e := newEnv(t)
	c := New(e.mc, nil, Config{}, nil)
	ours := Fence{At: BinlogPosition{File: "mysql-bin.000003", Pos: 400}, ID: 7 << 16}
	theirs := Fence{At: BinlogPosition{File: "mysql-bin.000003", Pos: 900}, ID: 7 << 16}
	for _, tc := range []struct {
		name    string
		fence   Fence
		deleted bool
	}{{"our fence", ours, true}, {"their fence", theirs, false}} {
		t.Run(tc.name, func(t *testing.T) {
			k := e.key("comments:" + strings.ReplaceAll(tc.name, " ", "-"))
			if err := c.storeFence(k, tc.fence); err != nil {
				t.Fatal(err)
			}
			if err := e.mc.Set(&memcache.Item{Key: k, Value: []byte("5"), Flags: 7 << 16, Expiration: 60}); err != nil {
				t.Fatal(err)
			}
			c.dropLookalike(k, ours)
			_, err := e.mc.Get(k)
			if gone := errors.Is(err, memcache.ErrCacheMiss); gone != tc.deleted {
				t.Fatalf("counter deleted: %v (%v), want %v", gone, err, tc.deleted)
			}
		})
	}
}
