package observer

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer = testsvc.LogBuffer

// observed is a test bed: a real memcached, the daemon's text writer and
// an observer at 100% sampling with one short window.
type observed struct {
	t   *testing.T
	mc  *memcache.Client
	w   *cacheops.Applier
	o   *Observer
	rs  *rules.RuleSet
	log *syncBuffer
}

const testWindow = 150 * time.Millisecond

func newObserved(t *testing.T) *observed {
	addr := testsvc.Memcached(t)
	rs := testRules(t, "rules.yaml", "obs")
	mc := memcache.New(addr)
	sel, err := itemformat.NewSelector("", []itemformat.Server{{Addr: addr}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	o, err := New(Config{Sample: 1, MaxPerSecond: 1e6, Windows: []time.Duration{testWindow}, ConfirmAfter: 50 * time.Millisecond, MemcachedPerSecond: 1e6, MySQLPerSecond: 1e6, ReportEvery: 100 * time.Millisecond},
		Deps{Cache: mc, Servers: sel, Logger: slog.New(slog.NewTextHandler(logs, nil)), Member: "daemon-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return &observed{t: t, mc: mc, w: cacheops.NewTextApplier(mc, nil, nil, cacheops.Config{}, nil), o: o, rs: rs, log: logs}
}

// testRules parses testdata/file with a key prefix of this run only
// (prefix followed by a unique suffix).
func testRules(t *testing.T, file, prefix string) *rules.RuleSet {
	t.Helper()
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	prefix += testsvc.Unique() + ":"
	rs, err := rulefile.Parse(file, []byte(strings.Replace(string(data), "version: 1\n", "version: 1\nprefix: \""+prefix+"\"\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// plan returns the ops of inserts into table, one per row.
func (e *observed) plan(table string, rows ...rules.Row) []rules.Op {
	var ops []rules.Op
	for i, r := range rows {
		ev := rules.Event{Database: "app", Table: table, Operation: rules.Insert, After: r,
			Source: rules.Position{Topic: "cdc.app." + table, Partition: 0, Offset: int64(i), BinlogFile: "mysql-bin.000001", BinlogPos: int64(100 * (i + 1))}}
		var err error
		if ops, _, err = e.rs.Plan(ops, &ev); err != nil {
			e.t.Fatal(err)
		}
	}
	// The invalidations of earlier releases' keys are not observed
	// (TestObserverSkipsLegacyKeys).
	return slices.DeleteFunc(ops, func(op rules.Op) bool { return op.Legacy })
}

// TestObserverSkipsLegacyKeys: the ops on keys of earlier releases
// (rules.Op.Legacy) are neither sampled nor judged.
func TestObserverSkipsLegacyKeys(t *testing.T) {
	e := newObserved(t)
	var legacy []rules.Op
	for i := range 2 {
		ev := rules.Event{Database: "app", Table: "hot", Operation: rules.Insert, After: idRow("id", i+1),
			Source: rules.Position{Topic: "cdc.app.hot", Partition: 0, Offset: int64(i)}}
		ops, _, err := e.rs.Plan(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if op.Legacy {
				legacy = append(legacy, op)
			}
		}
	}
	if len(legacy) == 0 {
		t.Fatal("no legacy ops planned for a rule with copies")
	}
	for i := range legacy {
		if observable(&legacy[i]) {
			t.Errorf("legacy op %s %s is observed", legacy[i].Kind, legacy[i].Key)
		}
	}
}

// apply runs ops through the observer's hook and, unless lose, the writer.
func (e *observed) apply(ops []rules.Op, lose bool) {
	done := e.o.BeforeApply(context.Background(), ops)
	if done == nil {
		e.t.Fatal("nothing sampled at 100%")
	}
	res := make([]cacheops.Result, len(ops))
	if lose {
		for i := range res {
			res[i] = cacheops.Result{Outcome: cacheops.OutcomeIncr}
		}
	} else if err := e.w.Apply(context.Background(), ops, res); err != nil {
		e.t.Fatal(err)
	}
	done(ops, res)
}

// settle waits until every sampled change had its check.
func (e *observed) settle() Counts {
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.o.mu.Lock()
		n := e.o.pending
		e.o.mu.Unlock()
		if n == 0 {
			return e.o.Totals()[0]
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d changes still pending", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func idRow(col string, id int) rules.Row {
	return rules.Row{{Name: col, Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(id)}}}
}

// setSet stores a set of op's rule holding tokens under the current
// generation of its table (docs/formats.md, "Generations"), creating the
// generation item when there is none.
func (e *observed) setSet(op rules.Op, tokens string) {
	e.t.Helper()
	gen := "1782579200000000001"
	if it, err := e.mc.Get(op.Rule.Generation); err == nil {
		gen = string(it.Value)
	} else {
		e.set(op.Rule.Generation, gen)
	}
	e.set(op.Key, "g"+gen+" "+tokens)
}

func (e *observed) set(key, value string) {
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
		e.t.Fatal(err)
	}
}

// TestObserverBumps: every copy of a hot namespace and every master with
// evidence is judged consistent when the writer applied the bump, and
// inconsistent (logged with the key, the server and the event's position)
// when the bump was lost.
func TestObserverBumps(t *testing.T) {
	e := newObserved(t)
	hot := e.plan("hot", idRow("id", 1), idRow("id", 2))
	if len(hot) != 6 {
		t.Fatalf("%d ops for two rows with 3 copies", len(hot))
	}
	// Namespaces present before: copies of id 1 (a bump must move them),
	// the master (the bump must set the entity's bit).
	for _, op := range hot[:3] {
		e.set(op.Key, "1782579200000000003")
	}
	ent := e.plan("entity", idRow("id", 7))
	master := ent[0].Rule.Evidence.MasterKey
	e.set(master, "1782579200000000003 0000000000000000")
	e.apply(append(hot, ent...), false)
	c := e.settle()
	// 6 copies + the entity's namespace + its master.
	if c.Consistent != 8 || c.Inconsistent != 0 || c.NotJudged != 0 {
		t.Fatalf("applied bumps: %+v, want 8 consistent\n%s", c, e.log.String())
	}

	// The same bumps lost, the master's bits clear again.
	e.set(master, "1782579200000000009 0000000000000000")
	e.apply(append(hot, ent...), true)
	c = e.settle()
	if c.Inconsistent != 8 {
		t.Fatalf("lost bumps: %+v, want 8 more inconsistent\n%s", c, e.log.String())
	}
	logs := e.log.String()
	for _, k := range []string{hot[0].Key, hot[5].Key, ent[0].Key, master} {
		if !strings.Contains(logs, "key="+k+" ") {
			t.Errorf("no inconsistency logged for %s:\n%s", k, logs)
		}
	}
	for _, want := range []string{"server=" + testsvc.Memcached(t), "topic=cdc.app.hot", "binlog_file=mysql-bin.000001", "expected=", "seen=",
		"history=\"", " bump answered incr by daemon-a batch cdc.app.hot/0@"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the evidence lacks %q:\n%s", want, logs)
		}
	}
	// The periodic report: the nines of each interval, per window.
	// One interval at least saw some of the lost bumps: fewer than all
	// nines.
	report := regexp.MustCompile(`msg=consistency window=150ms interval=100ms nines=[0-9.]+ judged=\d+ consistent=\d+ missing=\d+ inconsistent=[1-9]`)
	deadline := time.Now().Add(5 * time.Second)
	for !report.MatchString(e.log.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no consistency report counts the lost bumps:\n%s", e.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestObserverSetWithoutQuery: a set of a rule without a load query is
// judged against the latest change the daemon applied to each member; a
// token appended by an outside writer that contradicts it is
// inconsistent, a missing set is missing.
func TestObserverSetWithoutQuery(t *testing.T) {
	e := newObserved(t)
	row := func(item int, tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(item)}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	ops := e.plan("tags", row(1, "red"), row(2, "blue"), row(3, "green"), row(4, "gray"))
	// The table's generation (docs/formats.md, "Generations"): ops[3]'s
	// set is of an earlier one, so readers see it missing.
	const gen = 1782579200000000005
	e.set(ops[0].Rule.Generation, strconv.Itoa(gen))
	e.set(ops[0].Key, "g"+strconv.Itoa(gen)+" +old ")
	e.set(ops[1].Key, "g"+strconv.Itoa(gen)+" +old ")
	e.set(ops[3].Key, "g"+strconv.Itoa(gen-1)+" +old ")
	// ops[2]'s set stays missing: the writer never creates a set
	// without a load query.
	e.apply(ops, false)
	c := e.settle()
	if c.Consistent != 2 || c.Missing != 2 || c.Inconsistent != 0 {
		t.Fatalf("applied: %+v, want 2 consistent and 2 missing (one absent, one of an earlier generation)\n%s", c, e.log.String())
	}
	ops = e.plan("tags", row(1, "red"), row(2, "blue"))
	done := e.o.BeforeApply(context.Background(), ops)
	res := make([]cacheops.Result, len(ops))
	if err := e.w.Apply(context.Background(), ops, res); err != nil {
		t.Fatal(err)
	}
	// An outside writer removes the member the change added.
	if err := e.mc.Append(&memcache.Item{Key: ops[1].Key, Value: []byte("-blue ")}); err != nil {
		t.Fatal(err)
	}
	done(ops, res)
	c = e.settle()
	if c.Inconsistent != 1 || c.Consistent != 3 {
		t.Fatalf("outside writer: %+v, want 1 inconsistent\n%s", c, e.log.String())
	}
	if !strings.Contains(e.log.String(), "key="+ops[1].Key+" ") {
		t.Errorf("the inconsistency does not name %s:\n%s", ops[1].Key, e.log.String())
	}
}

// TestObserverBudget: with its memcached budget spent, the observer
// samples no bump (it cannot read the version before it) and judges no
// check; both are counted, never taken for consistent.
func TestObserverBudget(t *testing.T) {
	e := newObserved(t)
	ops := e.plan("hot", idRow("id", 1))
	e.o.mcBudget = newBucket(1e-9, time.Now())
	e.o.mcBudget.tokens = 0
	if done := e.o.BeforeApply(context.Background(), ops); done != nil {
		done(ops, make([]cacheops.Result, len(ops)))
	}
	if c := e.settle(); c != (Counts{}) {
		t.Errorf("checks without budget: %+v", c)
	}
	if got := testutilCounter(e.o.m.drops[dropBudget]); got != 3 {
		t.Errorf("%v bumps dropped for the budget, want 3", got)
	}
	if got := testutilCounter(e.o.m.budgetSpent.WithLabelValues("memcached")); got != 1 {
		t.Errorf("budget exhausted %v times, want 1", got)
	}

	// Budget for the reads before, none left for the checks.
	e.o.mcBudget = newBucket(3, time.Now())
	e.apply(ops, false)
	e.o.mcBudget.mu.Lock()
	e.o.mcBudget.rate, e.o.mcBudget.tokens = 1e-9, 0
	e.o.mcBudget.mu.Unlock()
	if c := e.settle(); c.NotJudged != 3 || c.Judged() != 0 {
		t.Errorf("checks over budget: %+v, want 3 not judged", c)
	}
	if reads := testutilCounter(e.o.m.mcReads); reads != 3 {
		t.Errorf("%v memcached reads counted, want the 3 before the bumps", reads)
	}
}
