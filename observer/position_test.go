package observer

import (
	"context"
	"database/sql"
	"log/slog"
	"strconv"
	"strings"
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

// positioned is a test bed for counters judged at a binary log position:
// a real MariaDB with its binary log on, a real memcached, and the test
// in the daemon's place: it commits row changes at once and applies
// their incrs (in binary log order, as a daemon does) only when it
// "publishes" them.
type positioned struct {
	t    *testing.T
	ctx  context.Context
	conn *sql.Conn
	mc   *memcache.Client
	rs   *rules.RuleSet
	o    *Observer
	log  *syncBuffer
	// truth counts the checks' recounts.
	truth *countingTruth
	// offset is the next Kafka offset of the changes' partition.
	offset int64
}

const (
	positionWindow = 150 * time.Millisecond
	// positionConfirm bounds the wait for the daemon to reach a
	// recount's position; the test makes the daemon reach it as soon as
	// the recounts ran (recountsDone), one insert and one incr later.
	// The checks that never see it reached (those of the last change of
	// each step) hold settle this long.
	positionConfirm = 3 * time.Second
	positionTopic   = "cdc.app.comments"
)

func newPositioned(t *testing.T) *positioned {
	addr := testsvc.Memcached(t)
	db, dsn := testsvc.MySQLBinlog(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE comments (id INT AUTO_INCREMENT PRIMARY KEY, post_id INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	db2, err := counters.OpenMySQL(dsn, counters.DBConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db2.Close() })
	truth := &countingTruth{MySQL: db2}
	rs := testRules(t, "counters.yaml", "obsat")
	mc := memcache.New(addr)
	logs := &syncBuffer{}
	o, err := New(Config{Sample: 1, MaxPerSecond: 1e6, Windows: []time.Duration{positionWindow}, ConfirmAfter: positionConfirm,
		MemcachedPerSecond: 1e6, MySQLPerSecond: 1e6, ReportEvery: time.Minute},
		Deps{Cache: mc, Truth: truth, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	o.SetPartitionCounts(map[string]int{positionTopic: 1})
	return &positioned{t: t, ctx: ctx, conn: conn, mc: mc, rs: rs, o: o, log: logs, truth: truth}
}

// countingTruth counts the recounts in a snapshot that returned.
type countingTruth struct {
	*counters.MySQL
	recounts atomic.Int64
}

func (c *countingTruth) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts counters.SnapshotOptions) (counters.SnapshotCount, error) {
	defer c.recounts.Add(1)
	return c.MySQL.CountInSnapshot(ctx, query, args, opts)
}

// recountsDone waits until n more recounts (the checks' first readings)
// than before returned: the state a fixed sleep of one window would reach
// only on an idle machine.
func (p *positioned) recountsDone(before int64, n int) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.truth.recounts.Load() < before+int64(n) {
		if time.Now().After(deadline) {
			p.t.Fatalf("%d of %d recounts ran in 30s", p.truth.recounts.Load()-before, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// commit inserts a comment on post and returns its change event, with
// the position Debezium reports (where its row event starts).
func (p *positioned) commit(post int) rules.Event {
	p.t.Helper()
	tx, err := testsvc.ExecLogged(p.ctx, p.conn, "INSERT INTO comments (post_id) VALUES (?)", post)
	if err != nil {
		p.t.Fatal(err)
	}
	ev := rules.Event{Database: "app", Table: "comments", Operation: rules.Insert, After: idRow("post_id", post),
		Source: rules.Position{Topic: positionTopic, Partition: 0, Offset: p.offset, BinlogFile: tx.File, BinlogPos: tx.RowsPos}}
	p.offset++
	return ev
}

// publish applies events as the daemon would, one batch each, through
// the observer's hook.
func (p *positioned) publish(evs ...rules.Event) {
	p.t.Helper()
	for i := range evs {
		ops, _, err := p.rs.Plan(nil, &evs[i])
		if err != nil || len(ops) != 1 || ops[0].Kind != rules.OpCount {
			p.t.Fatalf("planned %+v, %v: want one counter delta", ops, err)
		}
		ops[0].Key = p.stamp(ops[0])
		done := p.o.BeforeApply(p.ctx, ops)
		if done == nil {
			p.t.Fatal("nothing sampled at 100%")
		}
		if _, err := p.mc.Increment(ops[0].Key, uint64(ops[0].Delta)); err != nil {
			p.t.Fatalf("incr %s: %v", ops[0].Key, err)
		}
		done(ops, make([]cacheops.Result, len(ops)))
	}
}

func (p *positioned) key(post int) string {
	ev := rules.Event{Database: "app", Table: "comments", Operation: rules.Insert, After: idRow("post_id", post)}
	ops, _, err := p.rs.Plan(nil, &ev)
	if err != nil || len(ops) != 1 {
		p.t.Fatalf("planned %+v, %v", ops, err)
	}
	return p.stamp(ops[0])
}

// positionedGen is the generation of the comments table.
const positionedGen = 1782579200000000005

// stamp returns the key of op's counter under the table's generation (which
// it stores), as the daemon's pipeline moves counter ops
// (docs/formats.md, "Generations").
func (p *positioned) stamp(op rules.Op) string {
	p.t.Helper()
	if err := p.mc.Set(&memcache.Item{Key: op.Rule.Generation, Value: []byte(strconv.Itoa(positionedGen))}); err != nil {
		p.t.Fatal(err)
	}
	return itemformat.CounterKey(op.Key, positionedGen)
}

// settle waits until every sampled change had its check.
func (p *positioned) settle() Counts {
	deadline := time.Now().Add(20 * time.Second)
	for p.o.Pending() > 0 {
		if time.Now().After(deadline) {
			p.t.Fatalf("%d changes still pending", p.o.Pending())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p.o.Totals()[0]
}

// TestCounterJudgedAtPosition: with a database that names its snapshots'
// binary log positions, a counter behind MySQL only because changes are
// not yet published (upstream lag) is not judged, never inconsistent, and
// is judged consistent once they are applied and the daemon has gone past
// the recount's position; a counter an outside writer changed is reported
// inconsistent within one window (and the wait for the daemon to pass the
// recount's position).
func TestCounterJudgedAtPosition(t *testing.T) {
	p := newPositioned(t)
	for _, post := range []int{1, 2, 3} {
		if err := p.mc.Set(&memcache.Item{Key: p.key(post), Value: []byte("0")}); err != nil {
			t.Fatal(err)
		}
	}

	// (1) Upstream lag: three comments on post 1 are committed, one is
	// published. The counter says 1, MySQL 3, for as long as the other
	// two are on their way.
	a := p.commit(1)
	lagging := []rules.Event{p.commit(1), p.commit(1)}
	p.publish(a)
	c := p.settle()
	t.Logf("lagging upstream: %+v", c)
	if c.Inconsistent != 0 {
		t.Fatalf("a counter behind only because of upstream lag was reported inconsistent (%+v):\n%s", c, p.log.String())
	}
	if c.NotJudged != 1 || c.Consistent != 0 {
		t.Errorf("want the lagging counter not judged: %+v", c)
	}
	// The lagging changes arrive; the daemon goes on past the recounts'
	// positions (a change of another post) while their checks wait.
	n := p.truth.recounts.Load()
	p.publish(lagging...)
	p.recountsDone(n, len(lagging))
	p.publish(p.commit(2))
	c = p.settle()
	t.Logf("caught up: %+v", c)
	if c.Inconsistent != 0 {
		t.Fatalf("reported inconsistent (%+v):\n%s", c, p.log.String())
	}
	if c.Consistent != 2 {
		t.Errorf("want the two lagging changes judged consistent once applied: %+v\n%s", c, p.log.String())
	}

	// (1b) The lagging change arrives after the check's first read but
	// before the daemon goes past the recount's position: the counter
	// moved, so the first read does not hold every change up to the
	// position, and the counter is not judged.
	before := c
	x, y := p.commit(1), p.commit(1)
	n = p.truth.recounts.Load()
	p.publish(x)
	p.recountsDone(n, 1)
	p.publish(y, p.commit(2))
	c = p.settle()
	t.Logf("caught up after the first read: %+v", c)
	if c.Inconsistent != before.Inconsistent || c.Consistent != before.Consistent {
		t.Fatalf("want the counter that moved while the daemon caught up not judged: %+v\n%s", c, p.log.String())
	}

	// (2) An outside writer adds 1000 to post 3's counter right after the
	// daemon applied a change to it; the daemon goes on.
	before = c
	n = p.truth.recounts.Load()
	p.publish(p.commit(3))
	if _, err := p.mc.Increment(p.key(3), 1000); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.recountsDone(n, 1)
	p.publish(p.commit(2))
	// Reported by the window's own checks, before settle flushes the
	// observer: how soon is measured (logged), not asserted, since a
	// loaded machine delays it.
	const deadline = 30 * time.Second
	for !strings.Contains(p.log.String(), "key="+p.key(3)) && time.Since(start) < deadline {
		time.Sleep(5 * time.Millisecond)
	}
	reported := time.Since(start)
	if reported >= deadline {
		t.Errorf("not reported %s after the write, before anything but the window could report it", deadline)
	}
	c = p.settle()
	t.Logf("outside writer reported %s after its write (window %s, wait for the daemon %s): %+v", reported.Round(time.Millisecond), positionWindow, positionConfirm, c)
	if c.Inconsistent-before.Inconsistent != 1 {
		t.Fatalf("want the counter an outside writer changed reported once: %+v\n%s", c, p.log.String())
	}
	logs := p.log.String()
	for _, want := range []string{"key=" + p.key(3), `expected="1 (recount at `, "seen=1001", "binlog_file="} {
		if !strings.Contains(logs, want) {
			t.Errorf("the evidence lacks %q:\n%s", want, logs)
		}
	}
}
