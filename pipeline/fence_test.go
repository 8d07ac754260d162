package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

const fenceRules = `
version: 1
prefix: "PREFIX"
rules:
  - name: post-comments
    table: comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
`

// driftOptions shape one drift run: a writer commits row changes to
// MariaDB while Daemons daemon instances, one per partition of the change
// topic (rows go to partition id % Daemons), apply their events Lag
// messages late, in batches of Batch, concurrently. Every FlushEvery
// changes the daemons catch up, the counters are compared with COUNT(*)
// (a checkpoint), and then flushed from memcached (eviction, restart,
// flush_all); every ReassignEvery changes each daemon processes a batch as
// the first after a partition assignment (its deltas become recounts).
type driftOptions struct {
	Seed                      uint64
	Changes, Posts, Daemons   int
	Lag, Batch                int
	FlushEvery, ReassignEvery int
	// Pipelined applies the deltas with the pipelined writer and leaves
	// the recounts to the counters (Config.DeltasToWriter), as the
	// daemon does with memcached.protocol meta.
	Pipelined bool
}

// driftResult is what a run's checkpoints found, comparing the counters
// with COUNT(*) whenever the daemons had caught up.
type driftResult struct {
	// Checkpoints is the number of comparisons. Drift sums
	// |counter - COUNT(*)| over the posts and checkpoints, MaxDrift is the
	// largest sum of one checkpoint, FinalDrift the last one's.
	Checkpoints                 int
	Drift, MaxDrift, FinalDrift int64
	// Over and Under count the (checkpoint, post) pairs whose counter was
	// above or below COUNT(*); Missing those without a counter (a
	// correct state).
	Over, Under, Missing int
	// Fence sums the pipelines' fence statistics, Stats the counters'.
	Fence counters.FenceStats
	Stats counters.Stats
	// CounterDeltas counts the delta ops the counters applied.
	CounterDeltas int
}

// deltaCounter is an Applier that counts the delta ops it passes on.
type deltaCounter struct {
	Applier
	deltas atomic.Int64
}

func (d *deltaCounter) Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error {
	for i := range ops {
		if ops[i].Kind == rules.OpCount {
			d.deltas.Add(1)
		}
	}
	return d.Applier.Apply(ctx, ops, results)
}

// driftDaemon is one daemon instance: its own memcached client, MySQL
// pool, counters and pipeline, consuming one partition.
type driftDaemon struct {
	mc      *memcache.Client
	c       *counters.Counters
	applier *deltaCounter
	p       *Pipeline
	b       Batch
	queue   []Message
	fence   counters.FenceStats
	applied int
}

// driftRun runs the workload against a fresh database on a binlog-enabled
// MariaDB, with or without fences.
func driftRun(t *testing.T, fenced bool, o driftOptions) driftResult {
	t.Helper()
	db, dsn := testsvc.MySQLBinlog(t)
	if _, err := db.Exec(`CREATE TABLE comments (id BIGINT PRIMARY KEY AUTO_INCREMENT,
		post_id BIGINT NOT NULL, KEY (post_id)) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	prefix := "cwtest:" + testsvc.Unique() + ":"
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(fenceRules, "PREFIX", prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatal(err)
	}
	daemons := make([]*driftDaemon, o.Daemons)
	for i := range daemons {
		mysql, err := counters.OpenMySQL(dsn, counters.DBConfig{MaxOpenConns: 4}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer mysql.Close()
		mc := memcache.New(testsvc.Memcached(t))
		mc.MaxIdleConns = 16
		mc.Timeout = 2 * time.Second
		defer mc.Close()
		c := counters.New(mc, mysql, counters.Config{MaxConcurrency: 8, DisableFences: !fenced}, nil)
		applier := &deltaCounter{Applier: c}
		pc := Config{
			Rules:    rs,
			Writer:   cacheops.NewTextApplier(mc, nil, nil, cacheops.Config{MaxConcurrency: 8, CompactSample: -1}, nil),
			Counters: applier,
			RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		}
		if o.Pipelined {
			var servers memcache.ServerList
			if err := servers.SetServers(testsvc.Memcached(t)); err != nil {
				t.Fatal(err)
			}
			pw := cacheops.NewMetaApplier(&servers, nil, nil, cacheops.Config{
				CompactSample: -1, RecountElsewhere: true}, nil)
			defer pw.Close()
			pc.Writer, pc.DeltasToWriter = pw, true
		}
		if fenced {
			pc.Fences = c
		}
		p, err := New(pc)
		if err != nil {
			t.Fatal(err)
		}
		daemons[i] = &driftDaemon{mc: mc, c: c, applier: applier, p: p}
	}
	mc := daemons[0].mc

	var (
		ctx = context.Background()
		rng = rand.New(rand.NewPCG(o.Seed, 7))
		res driftResult
	)
	// checkpoint compares every counter with COUNT(*).
	checkpoint := func() {
		var drift int64
		for post := 1; post <= o.Posts; post++ {
			var want int64
			if err := db.QueryRow("SELECT COUNT(*) FROM comments WHERE post_id = ?", post).Scan(&want); err != nil {
				t.Fatal(err)
			}
			it, err := mc.Get(prefix + "comments:" + strconv.Itoa(post))
			if err == memcache.ErrCacheMiss {
				res.Missing++
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := strconv.ParseInt(strings.TrimRight(string(it.Value), " "), 10, 64)
			if err != nil {
				t.Fatalf("post %d: counter %q", post, it.Value)
			}
			switch {
			case got > want:
				res.Over++
				drift += got - want
			case got < want:
				res.Under++
				drift += want - got
			}
		}
		res.Checkpoints++
		res.Drift += drift
		res.MaxDrift = max(res.MaxDrift, drift)
		res.FinalDrift = drift
	}
	// catchUp has every daemon, concurrently, apply its queue down to
	// keep messages, a batch at a time.
	catchUp := func(keep int, reassigned bool) {
		var wg sync.WaitGroup
		errs := make(chan error, len(daemons))
		for _, d := range daemons {
			wg.Go(func() {
				for first := true; len(d.queue) > keep; first = false {
					n := min(o.Batch, len(d.queue)-keep)
					if err := d.p.Process(ctx, &d.b, d.queue[:n], CoalesceOptions{Recount: reassigned && first}); err != nil {
						errs <- err
						return
					}
					addFenceStats(&d.fence, d.b.Stats.Fence)
					d.queue = d.queue[n:]
					d.applied += n
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}

	var rows []driftRow
	for i := 1; i <= o.Changes; i++ {
		var (
			msg []byte
			r   driftRow
		)
		if len(rows) > 0 && rng.IntN(4) == 0 {
			j := rng.IntN(len(rows))
			r = rows[j]
			rows = append(rows[:j], rows[j+1:]...)
			tx, err := testsvc.ExecLogged(ctx, conn, "DELETE FROM comments WHERE id = ?", r.id)
			if err != nil {
				t.Fatal(err)
			}
			msg = driftEvent("d", r, tx)
		} else {
			r.post = int64(1 + rng.IntN(o.Posts))
			tx, err := testsvc.ExecLogged(ctx, conn, "INSERT INTO comments (post_id) VALUES (?)", r.post)
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRowContext(ctx, "SELECT LAST_INSERT_ID()").Scan(&r.id); err != nil {
				t.Fatal(err)
			}
			rows = append(rows, r)
			msg = driftEvent("c", r, tx)
		}
		part := int(r.id % int64(o.Daemons))
		d := daemons[part]
		d.queue = append(d.queue, Message{Value: msg, Pos: rules.Position{Topic: "comments", Partition: part, Offset: int64(d.applied + len(d.queue))}})
		if o.FlushEvery > 0 && i%o.FlushEvery == 0 {
			catchUp(0, false)
			checkpoint()
			for post := 1; post <= o.Posts; post++ {
				mc.Delete(prefix + "comments:" + strconv.Itoa(post))
			}
		}
		catchUp(o.Lag, o.ReassignEvery > 0 && i%o.ReassignEvery == 0)
	}
	catchUp(0, false)
	checkpoint()
	for _, d := range daemons {
		addFenceStats(&res.Fence, d.fence)
		s := d.c.Stats()
		res.CounterDeltas += int(d.applier.deltas.Load())
		res.Stats.Recounts += s.Recounts
		res.Stats.FencedRecounts += s.FencedRecounts
		res.Stats.UnfencedRecounts += s.UnfencedRecounts
		res.Stats.ExactRecountGiveUps += s.ExactRecountGiveUps
	}
	return res
}

type driftRow struct{ id, post int64 }

// driftEvent is the Debezium event of one committed row change, with the
// binary log position of its row event as the connector reports it.
func driftEvent(op string, r driftRow, tx testsvc.LoggedTx) []byte {
	image := map[string]any{"id": r.id, "post_id": r.post}
	ev := map[string]any{
		"op": op, "ts_ms": 1700000000000,
		"source": map[string]any{"connector": "mysql", "db": "blog", "table": "comments",
			"file": tx.File, "pos": tx.RowsPos, "gtid": tx.GTID, "snapshot": false},
	}
	if op == "d" {
		ev["before"], ev["after"] = image, nil
	} else {
		ev["before"], ev["after"] = nil, image
	}
	v, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	return v
}

func addFenceStats(sum *counters.FenceStats, s counters.FenceStats) {
	sum.Checked += s.Checked
	sum.Skipped += s.Skipped
	sum.Recounts += s.Recounts
	sum.FenceMissing += s.FenceMissing
	sum.OtherServer += s.OtherServer
	sum.Unfenced += s.Unfenced
	sum.Rechecked += s.Rechecked
	sum.RecheckRecounts += s.RecheckRecounts
}

func (r driftResult) String() string {
	return fmt.Sprintf("drift %d over %d checkpoints (max %d, final %d; %d counters over, %d under, %d missing); recounts %d (%d fenced, %d unfenced, %d given up); deltas checked %d, skipped %d, turned into recounts %d, rechecked %d, recounted after recheck %d",
		r.Drift, r.Checkpoints, r.MaxDrift, r.FinalDrift, r.Over, r.Under, r.Missing, r.Stats.Recounts, r.Stats.FencedRecounts, r.Stats.UnfencedRecounts, r.Stats.ExactRecountGiveUps,
		r.Fence.Checked, r.Fence.Skipped, r.Fence.Recounts, r.Fence.Rechecked, r.Fence.RecheckRecounts)
}

// TestFencedCountersHaveNoDrift measures the drift that recounts racing
// with in-flight events cause: counters are flushed mid-run, and batches
// are processed as after a reassignment, while events arrive late. Without
// fences rows committed before a recount's snapshot but applied after it
// count twice; with fences every counter ends equal to COUNT(*).
func TestFencedCountersHaveNoDrift(t *testing.T) {
	o := driftOptions{Seed: 42, Changes: 625, Posts: 6, Daemons: 2, Lag: 15, Batch: 5, FlushEvery: 50, ReassignEvery: 170}
	if testing.Short() {
		o.Changes = 200
	}
	unfenced := driftRun(t, false, o)
	t.Logf("without fences (%d changes, %d posts, %d daemons, events %d late per partition, flush every %d, reassignment every %d): %s",
		o.Changes, o.Posts, o.Daemons, o.Lag, o.FlushEvery, o.ReassignEvery, unfenced)
	fenced := driftRun(t, true, o)
	t.Logf("with fences: %s", fenced)
	if unfenced.Drift == 0 {
		t.Errorf("the workload caused no drift without fences; it does not measure the race")
	}
	if fenced.Drift != 0 {
		t.Errorf("with fences the counters drifted by %d", fenced.Drift)
	}
	if fenced.Stats.FencedRecounts == 0 || fenced.Fence.Skipped == 0 {
		t.Errorf("with fences: %s; want fenced recounts and skipped deltas", fenced)
	}
	o.Pipelined = true
	pipelined := driftRun(t, true, o)
	t.Logf("with fences, deltas pipelined: %s", pipelined)
	if pipelined.Drift != 0 {
		t.Errorf("with fences and pipelined deltas the counters drifted by %d", pipelined.Drift)
	}
	if pipelined.Stats.FencedRecounts == 0 || pipelined.Fence.Skipped == 0 {
		t.Errorf("with fences and pipelined deltas: %s; want fenced recounts and skipped deltas", pipelined)
	}
	// The pipelined writer applied every delta; the counters only recounted.
	if pipelined.CounterDeltas != 0 || fenced.CounterDeltas == 0 {
		t.Errorf("the counters applied %d deltas with pipelined deltas (want 0) and %d without (want some)", pipelined.CounterDeltas, fenced.CounterDeltas)
	}
}

// BenchmarkProcessCountDeltas measures what fences cost a batch of counter
// deltas: 200 insert events over 50 counters that exist and are fenced,
// processed with and without the fence check and recheck (one GetMulti
// round trip each per batch), and with the fences and the read of the
// counters' generations (docs/formats.md, "Generations"; one GetMulti per
// batch more).
func BenchmarkProcessCountDeltas(b *testing.B) {
	db, dsn := testsvc.MySQLBinlog(b)
	if _, err := db.Exec(`CREATE TABLE comments (id BIGINT PRIMARY KEY AUTO_INCREMENT, post_id BIGINT NOT NULL, KEY (post_id))`); err != nil {
		b.Fatal(err)
	}
	const posts, events = 50, 200
	mysql, err := counters.OpenMySQL(dsn, counters.DBConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer mysql.Close()
	prefix := "cwbench:" + testsvc.Unique() + ":"
	path := filepath.Join(b.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(fenceRules, "PREFIX", prefix)), 0o644); err != nil {
		b.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		b.Fatal(err)
	}
	mc := memcache.New(testsvc.Memcached(b))
	mc.MaxIdleConns = 64
	defer mc.Close()
	c := counters.New(mc, mysql, counters.Config{}, nil)
	rule := rs.Rules()[0]
	recounts := make([]rules.Op, posts)
	for i := range recounts {
		recounts[i] = rules.Op{Kind: rules.OpRecount, Rule: rule, Key: prefix + "comments:" + strconv.Itoa(i+1),
			Args: []rules.Value{{Kind: rules.KindInt, Text: strconv.Itoa(i + 1)}}}
	}
	if err := c.Apply(context.Background(), recounts, make([]cacheops.Result, posts)); err != nil {
		b.Fatal(err)
	}
	msgs := make([]Message, events)
	for i := range msgs {
		// Later than any fence: every delta is applied.
		tx := testsvc.LoggedTx{File: "mysql-bin.999999", RowsPos: int64(1000 + i)}
		msgs[i] = Message{Value: driftEvent("c", driftRow{id: int64(i + 1), post: int64(1 + i%posts)}, tx), Pos: rules.Position{Topic: "comments", Offset: int64(i)}}
	}
	for _, variant := range []string{"unfenced", "fenced", "fenced+generations"} {
		fenced := variant != "unfenced"
		b.Run(variant, func(b *testing.B) {
			pc := Config{Rules: rs, Writer: cacheops.NewTextApplier(mc, nil, nil, cacheops.Config{}, nil), Counters: c}
			if fenced {
				pc.Fences = c
			}
			if variant == "fenced+generations" {
				// The counters exist under the generation too.
				pc.Generations = memcacheGenerations{mc: mc}
				gens, err := pc.Generations.Generations(context.Background(), []string{rule.Generation})
				if err != nil {
					b.Fatal(err)
				}
				stamped := slices.Clone(recounts)
				for i := range stamped {
					stamped[i].Key = itemformat.CounterKey(stamped[i].Key, gens[rule.Generation])
				}
				if err := c.Apply(context.Background(), stamped, make([]cacheops.Result, posts)); err != nil {
					b.Fatal(err)
				}
			}
			p, err := New(pc)
			if err != nil {
				b.Fatal(err)
			}
			var batch Batch
			start := time.Now()
			n := 0
			for b.Loop() {
				if err := p.Process(context.Background(), &batch, msgs, CoalesceOptions{}); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(n*events)/time.Since(start).Seconds(), "events/s")
			if fenced && batch.Stats.Fence.Checked != events {
				b.Fatalf("fence stats %+v, want %d deltas checked", batch.Stats.Fence, events)
			}
		})
	}
}
