package observer

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// TestObserverCleanStreamWithReversals: a clean stream, applied by the
// daemon's writers to a real memcached and matching a real MariaDB, in
// which more than 30% of the set changes are reversed within 100 ms (a
// tag added, then removed again before a window's read, and the other way
// round) while other members of the same sets keep changing, and counters
// change several times a window (comments inserted and deleted in MariaDB
// on four partitions, their incrs and decrs applied by the daemon's
// counter path with fences): at every window, not one of at least 5,000
// judged checks is inconsistent, at least 1,000 of them counters judged
// at a binary log position. Every set member is judged against the latest
// change the daemon applied to it, not the sampled change's row image.
func TestObserverCleanStreamWithReversals(t *testing.T) {
	if testing.Short() {
		t.Skip("a stream of several thousand changes")
	}
	e := newObserved(t)
	const streams = 4 // like partitions: each applies its own items, in order
	cs := newCountedStream(t, e.mc, streams)
	// Two windows; the sampled change's member is often reversed before
	// the first.
	e.o.Close()
	o, err := New(Config{Sample: 1, MaxPerSecond: 1e6, Windows: []time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		ConfirmAfter: 100 * time.Millisecond, MemcachedPerSecond: 1e6, MySQLPerSecond: 1e6, ReportEvery: time.Hour, Workers: 16},
		Deps{Cache: e.mc, Truth: cs.truth, Logger: e.o.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	o.SetPartitionCounts(map[string]int{countedTopic: streams})
	e.o = o
	cs.o = o

	const (
		items   = 12   // sets per stream
		tags    = 6    // members per set
		changes = 4000 // new set changes, reversals come on top
	)
	row := func(item int, tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(item)}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	// Sets present from the start (a rule without a query never creates
	// one).
	for i := range streams * items {
		e.setSet(e.plan("tags", row(i, "x"))[0], "+x ")
	}
	var reversed sync.Mutex
	// nReversed counts the changes reversed 10 to 70ms after they were
	// applied, nWithin the reversals applied within 100ms.
	var nReversed, nWithin, nChanges int
	var wg sync.WaitGroup
	start := time.Now()
	for s := range streams {
		wg.Go(func() { cs.run(s) })
	}
	for s := range streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			in := map[[2]int]bool{}
			type pending struct {
				due, applied time.Time
				item, tag    int
			}
			var later []pending
			offset := int64(0)
			change := func(item, tag int) rules.Op {
				k := [2]int{item, tag}
				ev := rules.Event{Database: "app", Table: "tags", Operation: rules.Insert, After: row(item, "t"+strconv.Itoa(tag)),
					Source: rules.Position{Topic: "cdc.app.tags", Partition: s, Offset: offset}}
				if in[k] {
					ev.Operation, ev.Before, ev.After = rules.Delete, ev.After, nil
				}
				in[k] = !in[k]
				offset++
				ops, _, err := e.rs.Plan(nil, &ev)
				if err != nil || len(ops) != 1 {
					panic(fmt.Sprintf("plan: %v, %d ops", err, len(ops)))
				}
				return ops[0]
			}
			for n := 0; n < changes/streams || len(later) > 0; {
				var batch []rules.Op
				var reversals []pending
				now := time.Now()
				// Reversals due.
				keep := later[:0]
				for _, p := range later {
					if now.After(p.due) {
						batch = append(batch, change(p.item, p.tag))
						reversals = append(reversals, p)
					} else {
						keep = append(keep, p)
					}
				}
				later = keep
				var fresh []pending
				for range 1 + rng.IntN(4) {
					if n >= changes/streams {
						break
					}
					n++
					item, tag := s*items+rng.IntN(items), rng.IntN(tags)
					batch = append(batch, change(item, tag))
					if rng.Float64() < 0.4 {
						fresh = append(fresh, pending{due: now.Add(time.Duration(10+rng.IntN(60)) * time.Millisecond), item: item, tag: tag})
					}
				}
				if len(batch) > 0 {
					done := e.o.BeforeApply(context.Background(), batch)
					res := make([]cacheops.Result, len(batch))
					if err := e.w.Apply(context.Background(), batch, res); err != nil {
						t.Error(err)
						return
					}
					if done != nil {
						done(batch, res)
					}
				}
				applied := time.Now()
				// How soon each reversal came after the change it
				// reverses is measured (logged), not asserted.
				within := 0
				for _, p := range reversals {
					if applied.Sub(p.applied) <= 100*time.Millisecond {
						within++
					}
				}
				for i := range fresh {
					fresh[i].applied = applied
				}
				later = append(later, fresh...)
				reversed.Lock()
				nChanges += len(batch)
				nReversed += len(fresh)
				nWithin += within
				reversed.Unlock()
				time.Sleep(time.Duration(2+rng.IntN(4)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if t.Failed() {
		return
	}
	if float64(nReversed) < 0.3*float64(changes) {
		t.Fatalf("%d of %d set changes reversed, want at least 30%%", nReversed, changes)
	}
	deadline := time.Now().Add(60 * time.Second)
	for e.o.Pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d changes still pending", e.o.Pending())
		}
		time.Sleep(20 * time.Millisecond)
	}
	counted := e.o.Status().Rules[countedRule]
	for i, c := range e.o.Totals() {
		w := e.o.cfg.Windows[i]
		var cc Counts
		if i < len(counted) {
			cc = counted[i].Total
		}
		t.Logf("window %s: %+v (nines %s); counters %+v; %d set changes, %d reversed, %d within 100ms; %d counter changes on %d counters in %s (%.1f a counter and window)",
			w, c, c.NinesText(), cc, nChanges, nReversed, nWithin, cs.changes.Load(), countedPosts, elapsed.Round(time.Millisecond),
			float64(cs.changes.Load())/countedPosts/(float64(elapsed)/float64(w)))
		if c.Inconsistent != 0 || c.Judged() < 5000 {
			t.Errorf("window %s: %d inconsistent of %d judged, want 0 of at least 5,000\n%s", w, c.Inconsistent, c.Judged(), e.log.String())
		}
		if cc.Judged() < countedJudged {
			t.Errorf("window %s: %d counters judged, want at least %d: %+v", w, cc.Judged(), countedJudged, cc)
		}
	}
	cs.check()
}

// The counted half of the clean stream.
const (
	countedTopic = "cdc.app.comments"
	countedRule  = "post-comments"
	// countedPosts are the counters; countedChanges the comments inserted
	// and deleted, over all streams, at least: the streams go on, up to
	// four times as many, until countedJudged counters were judged at
	// every window (a loaded machine judges a smaller share: a counter
	// is judged only when nothing moved it while the daemon caught up
	// with the recount's position).
	countedPosts   = 16
	countedChanges = 4000
	countedJudged  = 1000
)

// countedStream is the counted half of the clean stream: a comments table
// in a MariaDB with its binary log on, whose rows each stream (a
// partition) inserts and deletes on a connection of its own, so that its
// changes are in the binary log in the order it applies them; the events
// carry the positions their commits got. Their deltas are applied by the
// daemon's counter path, as the pipeline runs it: under the table's
// generation, checked against the counters' fences (CheckDeltas), applied
// by counters.Counters (recounts in snapshots, fenced, on a miss or a decr
// to zero) and rechecked (RecheckDeltas), the observer's hook around them.
type countedStream struct {
	t       *testing.T
	db      *sql.DB
	truth   *counters.MySQL
	c       *counters.Counters
	rs      *rules.RuleSet
	mc      *memcache.Client
	o       *Observer
	streams int
	// changes counts the row changes applied.
	changes atomic.Int64
}

func newCountedStream(t *testing.T, mc *memcache.Client, streams int) *countedStream {
	db, dsn := testsvc.MySQLBinlog(t)
	if _, err := db.Exec("CREATE TABLE comments (id INT PRIMARY KEY, post_id INT NOT NULL, KEY (post_id)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	truth, err := counters.OpenMySQL(dsn, counters.DBConfig{MaxOpenConns: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { truth.Close() })
	rs := testRules(t, "counters.yaml", "obsclean")
	c := counters.New(mc, truth, counters.Config{}, nil)
	t.Cleanup(c.Close)
	cs := &countedStream{t: t, db: db, truth: truth, c: c, rs: rs, mc: mc, streams: streams}
	// The table's generation, which the counters live under.
	if err := mc.Set(&memcache.Item{Key: cs.op(0, 0).Rule.Generation, Value: []byte(strconv.FormatUint(positionedGen, 10))}); err != nil {
		t.Fatal(err)
	}
	return cs
}

func commentRow(id, post int) rules.Row {
	return rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(id)}}, {Name: "post_id", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(post)}}}
}

// op plans the insert of comment id on post.
func (cs *countedStream) op(id, post int) rules.Op {
	ev := rules.Event{Database: "app", Table: "comments", Operation: rules.Insert, After: commentRow(id, post)}
	ops, _, err := cs.rs.Plan(nil, &ev)
	if err != nil || len(ops) != 1 || ops[0].Kind != rules.OpCount {
		cs.t.Fatalf("planned %+v, %v: want one counter delta", ops, err)
	}
	return ops[0]
}

// run is stream s: it commits one to three comment inserts or deletes,
// then applies their events as one batch, until it made its share of
// countedChanges and enough counters were judged (or four times its share).
func (cs *countedStream) run(s int) {
	ctx := context.Background()
	conn, err := cs.db.Conn(ctx)
	if err != nil {
		cs.t.Error(err)
		return
	}
	defer conn.Close()
	rng := rand.New(rand.NewPCG(uint64(s), 11))
	type comment struct{ id, post int }
	var mine []comment
	next := s * 1_000_000
	offset := int64(0)
	share := countedChanges / cs.streams
	for n := 0; n < 4*share && (n < share || !cs.enough()); {
		var evs []rules.Event
		for range 1 + rng.IntN(3) {
			n++
			var ev rules.Event
			var tx testsvc.LoggedTx
			if len(mine) > 0 && rng.Float64() < 0.45 {
				i := rng.IntN(len(mine))
				c := mine[i]
				mine[i] = mine[len(mine)-1]
				mine = mine[:len(mine)-1]
				tx, err = testsvc.ExecLogged(ctx, conn, "DELETE FROM comments WHERE id = ?", c.id)
				ev = rules.Event{Operation: rules.Delete, Before: commentRow(c.id, c.post)}
			} else {
				next++
				c := comment{next, rng.IntN(countedPosts)}
				mine = append(mine, c)
				tx, err = testsvc.ExecLogged(ctx, conn, "INSERT INTO comments (id, post_id) VALUES (?, ?)", c.id, c.post)
				ev = rules.Event{Operation: rules.Insert, After: commentRow(c.id, c.post)}
			}
			if err != nil {
				cs.t.Error(err)
				return
			}
			ev.Database, ev.Table = "app", "comments"
			ev.Source = rules.Position{Topic: countedTopic, Partition: s, Offset: offset, BinlogFile: tx.File, BinlogPos: tx.RowsPos}
			offset++
			evs = append(evs, ev)
		}
		if !cs.apply(ctx, evs) {
			return
		}
		time.Sleep(time.Duration(2+rng.IntN(4)) * time.Millisecond)
	}
}

// enough reports whether countedJudged counters were judged at every
// window.
func (cs *countedStream) enough() bool {
	ws := cs.o.Status().Rules[countedRule]
	for _, w := range ws {
		if w.Total.Judged() < countedJudged {
			return false
		}
	}
	return len(ws) > 0
}

// apply applies the events of one batch as the daemon's pipeline does.
func (cs *countedStream) apply(ctx context.Context, evs []rules.Event) bool {
	var ops []rules.Op
	for i := range evs {
		var err error
		if ops, _, err = cs.rs.Plan(ops, &evs[i]); err != nil {
			cs.t.Error(err)
			return false
		}
	}
	for i := range ops {
		ops[i].Key = itemformat.CounterKey(ops[i].Key, positionedGen)
	}
	var d counters.DeltaFence
	ops, err := cs.c.CheckDeltas(ctx, &d, ops)
	if err != nil {
		cs.t.Error(err)
		return false
	}
	done := cs.o.BeforeApply(ctx, ops)
	res := make([]cacheops.Result, len(ops))
	if err := cs.c.Apply(ctx, ops, res); err != nil {
		cs.t.Error(err)
		return false
	}
	recounts, err := cs.c.RecheckDeltas(ctx, &d, nil, ops, res)
	if err != nil {
		cs.t.Error(err)
		return false
	}
	if len(recounts) > 0 {
		if err := cs.c.Apply(ctx, recounts, make([]cacheops.Result, len(recounts))); err != nil {
			cs.t.Error(err)
			return false
		}
	}
	if done != nil {
		done(ops, res)
	}
	cs.changes.Add(int64(len(evs)))
	return true
}

// check: once the stream is over, every counter present holds its count
// in MariaDB (the stream was clean), and most are present.
func (cs *countedStream) check() {
	present := 0
	for post := range countedPosts {
		key := itemformat.CounterKey(cs.op(0, post).Key, positionedGen)
		var want int64
		if err := cs.db.QueryRow("SELECT COUNT(*) FROM comments WHERE post_id = ?", post).Scan(&want); err != nil {
			cs.t.Fatal(err)
		}
		it, err := cs.mc.Get(key)
		if err != nil {
			continue
		}
		present++
		if n, ok := itemformat.ParseCount(it.Value); !ok || n != want {
			cs.t.Errorf("counter %s holds %q, MariaDB counts %d: the stream was not clean", key, it.Value, want)
		}
	}
	if present < countedPosts/2 {
		cs.t.Errorf("only %d of %d counters present at the end", present, countedPosts)
	}
}

// TestObserverBusySetJudged: a member an outside writer removed right
// after the daemon added it is reported even while the daemon keeps
// changing other members of the same set between the two readings of
// the confirm step (only the members in question are compared).
func TestObserverBusySetJudged(t *testing.T) {
	e := newObserved(t)
	row := func(tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	ops := e.plan("tags", row("red"))
	e.setSet(ops[0], "+old ")
	done := e.o.BeforeApply(context.Background(), ops)
	res := make([]cacheops.Result, len(ops))
	if err := e.w.Apply(context.Background(), ops, res); err != nil {
		t.Fatal(err)
	}
	done(ops, res)
	// The outside writer.
	if err := e.mc.Append(&memcache.Item{Key: ops[0].Key, Value: []byte("-red ")}); err != nil {
		t.Fatal(err)
	}
	// The daemon changes other members past the window and the confirm
	// step of red's check.
	for i, end := 0, time.Now().Add(testWindow+time.Second); time.Now().Before(end); i++ {
		e.apply(e.plan("tags", row("busy"+strconv.Itoa(i%50))), false)
		time.Sleep(5 * time.Millisecond)
	}
	c := e.settle()
	if c.Inconsistent != 1 {
		t.Fatalf("busy set: %+v, want the removed member reported\n%s", c, e.log.String())
	}
	if want := "key=" + ops[0].Key + " "; !strings.Contains(e.log.String(), want) || !strings.Contains(e.log.String(), "expected=+red seen=-red") {
		t.Errorf("the report does not name %s with expected=+red seen=-red:\n%s", ops[0].Key, e.log.String())
	}
	// Its history: the daemon appended +red (memcached answered
	// appended) and nothing of its own removed it, so an outside writer
	// did.
	history := regexp.MustCompile(`history="[0-9:.]+Z set_add \+red answered appended by daemon-a batch cdc\.app\.tags/0@0(; [^"]*)?"`)
	if !history.MatchString(e.log.String()) {
		t.Errorf("the report lacks the key's history:\n%s", e.log.String())
	}
	if strings.Contains(e.log.String(), "set_remove -red") {
		t.Errorf("the history shows a removal of red the daemon never applied:\n%s", e.log.String())
	}
}

// TestObserverChangeInFlight: a change memcached already holds but the
// daemon has not finished applying (its batch is still in its fence
// checks) is not taken for a wrong member: the member is not judged
// while its change is in flight, never inconsistent.
func TestObserverChangeInFlight(t *testing.T) {
	e := newObserved(t)
	row := func(tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	add := e.plan("tags", row("red"))
	e.setSet(add[0], "+old ")
	e.apply(add, false)
	// The removal: written to memcached, its batch done only after the
	// window and the confirm step of the add's check.
	ev := rules.Event{Database: "app", Table: "tags", Operation: rules.Delete, Before: row("red"),
		Source: rules.Position{Topic: "cdc.app.tags", Offset: 1}}
	remove, _, err := e.rs.Plan(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	done := e.o.BeforeApply(context.Background(), remove)
	res := make([]cacheops.Result, len(remove))
	if err := e.w.Apply(context.Background(), remove, res); err != nil {
		t.Fatal(err)
	}
	time.Sleep(testWindow + 500*time.Millisecond)
	if done != nil {
		done(remove, res)
	}
	c := e.settle()
	if c.Inconsistent != 0 {
		t.Fatalf("a change in flight was reported: %+v\n%s", c, e.log.String())
	}
	if c.NotJudged == 0 {
		t.Errorf("the add's check, with the member's removal in flight: %+v, want not judged", c)
	}
}
