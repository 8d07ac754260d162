package cacheops

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// plClock is the fixed clock of the pipeline tests: new namespaces start
// at its unix milliseconds.
var plClock = time.UnixMilli(1_700_000_000_456)

var (
	plBumpRule  = &rules.Rule{Name: "ns", Kind: rules.BumpRule, TTL: time.Hour}
	plSetRule   = &rules.Rule{Name: "set", Kind: rules.SetRule, TTL: 2 * time.Hour}
	plCountRule = &rules.Rule{Name: "count", Kind: rules.CountRule, TTL: 3 * time.Hour}
)

type plEnv struct {
	addr    string
	servers *memcache.ServerList
	mc      *memcache.Client
	prefix  string
}

func newPLEnv(t testing.TB, addrs ...string) *plEnv {
	t.Helper()
	if len(addrs) == 0 {
		addrs = []string{testsvc.Memcached(t)}
	}
	var sl memcache.ServerList
	if err := sl.SetServers(addrs...); err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(&sl)
	mc.Timeout = 2 * time.Second
	mc.MaxIdleConns = 16
	t.Cleanup(func() { mc.Close() })
	return &plEnv{addr: addrs[0], servers: &sl, mc: mc, prefix: "cwpipe:" + testsvc.Unique() + ":"}
}

func (e *plEnv) key(name string) string { return e.prefix + name }

// writer returns a meta Applier over e's servers with the test clock and
// sampled compaction off unless cfg says otherwise.
func (e *plEnv) writer(t testing.TB, loader SetLoader, rc Recounter, cfg Config) *Applier {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return plClock }
	}
	if cfg.CompactSample == 0 {
		cfg.CompactSample = -1
	}
	w := NewMetaApplier(e.servers, loader, rc, cfg, nil)
	t.Cleanup(func() { w.Close() })
	return w
}

func (e *plEnv) set(t testing.TB, key, value string) {
	t.Helper()
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
		t.Fatalf("set %q: %v", key, err)
	}
}

// value returns the item's value, or ok false when it is missing.
func (e *plEnv) value(t testing.TB, key string) (string, bool) {
	t.Helper()
	return itemValue(t, e.mc, key)
}

func (e *plEnv) wantValue(t testing.TB, key, want string) {
	t.Helper()
	if v, ok := e.value(t, key); !ok || v != want {
		t.Errorf("%s = %q (present %v), want %q", key, v, ok, want)
	}
}

func (e *plEnv) wantMissing(t testing.TB, key string) {
	t.Helper()
	if v, ok := e.value(t, key); ok {
		t.Errorf("%s = %q, want it missing", key, v)
	}
}

// plTTL returns an item's remaining TTL in seconds (-1: none).
func plTTL(t testing.TB, addr, key string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "mg %s t\r\n", key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "HD t")
	n, err := strconv.Atoi(rest)
	if !ok || err != nil {
		t.Fatalf("mg %s t: %q", key, line)
	}
	return n
}

// plItemSizeMax returns the server's item size limit in bytes.
func plItemSizeMax(t testing.TB, addr string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprint(conn, "stats settings\r\n")
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[1] == "item_size_max" {
			n, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		if len(f) > 0 && f[0] == "END" {
			break
		}
	}
	t.Fatal("stats settings: no item_size_max")
	return 0
}

func plApply(t testing.TB, w *Applier, ops ...rules.Op) ([]Result, error) {
	t.Helper()
	results := make([]Result, len(ops))
	err := w.Apply(context.Background(), ops, results)
	failed := 0
	for _, r := range results {
		if (r.Err != nil) != (r.Outcome == OutcomeFailed) {
			t.Fatalf("inconsistent result %+v", r)
		}
		if r.Err != nil {
			failed++
		}
	}
	if (err != nil) != (failed > 0) {
		t.Fatalf("Apply = %v with %d failed ops", err, failed)
	}
	return results, err
}

func plApplyOne(t testing.TB, w *Applier, op rules.Op) Result {
	t.Helper()
	results, _ := plApply(t, w, op)
	return results[0]
}

func plWant(t testing.TB, r Result, want Outcome) {
	t.Helper()
	if r.Outcome != want || (r.Err != nil) != (want == OutcomeFailed) {
		t.Fatalf("result = %v (%v), want %v", r.Outcome, r.Err, want)
	}
}

func plBump(key string) rules.Op { return rules.Op{Kind: rules.OpBump, Rule: plBumpRule, Key: key} }

func plAppend(rule *rules.Rule, key, tokens string) rules.Op {
	return rules.Op{Kind: rules.OpSetAppend, Rule: rule, Key: key, Tokens: tokens}
}

func plAdd(rule *rules.Rule, key, member string) rules.Op {
	return rules.Op{Kind: rules.OpSetAdd, Rule: rule, Key: key, Member: rules.Escape(member)}
}

func plRemove(rule *rules.Rule, key, member string) rules.Op {
	return rules.Op{Kind: rules.OpSetRemove, Rule: rule, Key: key, Member: rules.Escape(member)}
}

func plCount(rule *rules.Rule, key string, delta int64, args ...rules.Value) rules.Op {
	return rules.Op{Kind: rules.OpCount, Rule: rule, Key: key, Delta: delta, Args: args}
}

func plRecount(rule *rules.Rule, key string, args ...rules.Value) rules.Op {
	return rules.Op{Kind: rules.OpRecount, Rule: rule, Key: key, Args: args}
}

func plInt(n int) rules.Value { return rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(n)} }

// plDB is a MariaDB database with the tables the pipeline tests query: a
// user's interests (a set) and a post's comments (a counter).
type plDB struct {
	db                  *sql.DB
	setRule, countRule  *rules.Rule
	badSetRule, badRule *rules.Rule
}

func newPLDB(t *testing.T) *plDB {
	t.Helper()
	db, _ := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE user_interests (user_id INT NOT NULL, interest VARCHAR(64) NOT NULL, PRIMARY KEY (user_id, interest))",
		"INSERT INTO user_interests VALUES (42, '7'), (42, 'rock climbing'), (42, '100%'), (43, '9')",
		"CREATE TABLE comments (id INT NOT NULL PRIMARY KEY, post_id INT NOT NULL)",
		"INSERT INTO comments VALUES (1, 9), (2, 9), (3, 9), (4, 10)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return &plDB{
		db:         db,
		setRule:    &rules.Rule{Name: "interests", Kind: rules.SetRule, TTL: 90 * time.Minute, Query: "SELECT interest FROM user_interests WHERE user_id = ? ORDER BY interest"},
		countRule:  &rules.Rule{Name: "comments", Kind: rules.CountRule, TTL: time.Hour, Query: "SELECT COUNT(*) FROM comments WHERE post_id = ?"},
		badSetRule: &rules.Rule{Name: "broken-set", Kind: rules.SetRule, Query: "SELECT interest FROM no_such_table WHERE user_id = ?"},
		badRule:    &rules.Rule{Name: "broken-count", Kind: rules.CountRule, Query: "SELECT COUNT(*) FROM no_such_table WHERE post_id = ?"},
	}
}

// plSQL implements SetLoader and Recounter over database/sql; before,
// when set, runs first (to act as another client meanwhile).
type plSQL struct {
	db     *sql.DB
	before func(ctx context.Context)
	calls  atomic.Int64
}

func plArgs(args []rules.Value) []any {
	vals := make([]any, len(args))
	for i, a := range args {
		if !a.IsNull() {
			vals[i] = a.Text
		}
	}
	return vals
}

func (s *plSQL) LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error) {
	s.calls.Add(1)
	if s.before != nil {
		s.before(ctx)
	}
	rows, err := s.db.QueryContext(ctx, query, plArgs(args)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var members []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			return nil, err
		}
		members = append(members, m)
	}
	return members, rows.Err()
}

func (s *plSQL) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	s.calls.Add(1)
	if s.before != nil {
		s.before(ctx)
	}
	var n int64
	err := s.db.QueryRowContext(ctx, query, plArgs(args)...).Scan(&n)
	return n, err
}

// plNoSQL fails the test when a query is run.
type plNoSQL struct{ t *testing.T }

func (n plNoSQL) LoadMembers(context.Context, string, []rules.Value) ([]string, error) {
	n.t.Error("set loaded")
	return nil, errors.New("set loaded")
}

func (n plNoSQL) Count(context.Context, string, []rules.Value) (int64, error) {
	n.t.Error("recount run")
	return 0, errors.New("recount run")
}

func TestPipelineBump(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{})
	existing, missing, junk := e.key("ns:1"), e.key("ns:2"), e.key("ns:junk")
	forever := e.key("ns:forever")
	e.set(t, existing, "100")
	e.set(t, junk, "not a number")
	results, err := plApply(t, w,
		plBump(existing), plBump(missing), plBump(junk),
		rules.Op{Kind: rules.OpBump, Rule: &rules.Rule{Name: "forever"}, Key: forever})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []Outcome{OutcomeIncr, OutcomeAdded, OutcomeDeleted, OutcomeAdded} {
		plWant(t, results[i], want)
	}
	clock := strconv.FormatUint(itemformat.NamespaceStart(plClock), 10)
	e.wantValue(t, existing, "101")
	e.wantValue(t, missing, clock)
	e.wantMissing(t, junk)
	if ttl := plTTL(t, e.addr, missing); ttl < 3590 || ttl > 3600 {
		t.Errorf("ttl of a created namespace = %d, want the rule's 3600", ttl)
	}
	if ttl := plTTL(t, e.addr, forever); ttl != -1 {
		t.Errorf("ttl = %d, want none (-1)", ttl)
	}
	// Two rounds: the bumps, then the delete of the non-numeric one.
	if s := w.Stats(); s.Rounds != 2 || s.RoundTrips != 2 || s.Commands != 5 || s.Deletes != 1 {
		t.Errorf("stats = %+v, want 2 rounds of one round trip, 5 commands, 1 delete", s)
	}

	// The second bump of a created namespace increments it.
	plWant(t, plApplyOne(t, w, plBump(missing)), OutcomeIncr)
	e.wantValue(t, missing, strconv.FormatUint(itemformat.NamespaceStart(plClock)+1, 10))
}

// TestPipelineBumpConcurrentMissing bumps one missing namespace from many
// goroutines: exactly one bump creates it, every other one increments.
func TestPipelineBumpConcurrentMissing(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{Meta: metaproto.PoolConfig{ConnsPerServer: 4}})
	key := e.key("ns:hot")
	const goroutines, bumps = 8, 25
	var added, incrs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Go(func() {
			<-start
			for range bumps {
				results := make([]Result, 1)
				w.Apply(context.Background(), []rules.Op{plBump(key)}, results)
				switch results[0].Outcome {
				case OutcomeAdded:
					added.Add(1)
				case OutcomeIncr:
					incrs.Add(1)
				default:
					t.Errorf("bump: %v (%v)", results[0].Outcome, results[0].Err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if added.Load() != 1 || incrs.Load() != goroutines*bumps-1 {
		t.Errorf("added %d, incr %d; want 1 and %d", added.Load(), incrs.Load(), goroutines*bumps-1)
	}
	e.wantValue(t, key, strconv.FormatUint(itemformat.NamespaceStart(plClock)+goroutines*bumps-1, 10))
}

func TestPipelineSetAppend(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, plNoSQL{t}, nil, Config{})
	k1, k2, k3 := e.key("set:1"), e.key("set:2"), e.key("set:3")
	e.set(t, k1, "+a ")
	e.set(t, k2, "+x ")
	e.set(t, k3, "+y +z ")
	results, err := plApply(t, w,
		plAppend(plSetRule, k1, "+b -a +c%20d "),
		plAdd(plSetRule, k2, "new member"),
		plRemove(plSetRule, k3, "y"),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		plWant(t, r, OutcomeAppended)
	}
	e.wantValue(t, k1, "+a +b -a +c%20d ")
	e.wantValue(t, k2, "+x +new%20member ")
	e.wantValue(t, k3, "+y +z -y ")
	if s := w.Stats(); s.RoundTrips != 1 || s.Commands != 3 {
		t.Errorf("stats = %+v, want 3 commands in one round trip", s)
	}
}

func TestPipelineSetMissing(t *testing.T) {
	e := newPLEnv(t)
	t.Run("without load", func(t *testing.T) {
		withQuery := &rules.Rule{Name: "loaded", Query: "SELECT 1"}
		for name, w := range map[string]*Applier{
			"rule without load":     e.writer(t, plNoSQL{t}, nil, Config{}),
			"writer without loader": e.writer(t, nil, nil, Config{}),
		} {
			rule := plSetRule
			if name == "writer without loader" {
				rule = withQuery
			}
			key := e.key("set:missing:" + rules.Escape(name))
			plWant(t, plApplyOne(t, w, plAdd(rule, key, "m")), OutcomeMissing)
			e.wantMissing(t, key)
		}
	})

	d := newPLDB(t)
	t.Run("load", func(t *testing.T) {
		loader := &plSQL{db: d.db}
		w := e.writer(t, loader, nil, Config{})
		key := e.key("interests:42")
		op := plAdd(d.setRule, key, "rock climbing")
		op.Args = []rules.Value{plInt(42)}
		plWant(t, plApplyOne(t, w, op), OutcomeLoaded)
		e.wantValue(t, key, "+100%25 +7 +rock%20climbing ")
		if ttl := plTTL(t, e.addr, key); ttl < 5390 || ttl > 5400 {
			t.Errorf("ttl = %d, want the rule's 5400", ttl)
		}
		// append (NS), mg (EN), load, add.
		if s := w.Stats(); s.Commands != 3 || s.Loads != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("load loses the add race", func(t *testing.T) {
		key := e.key("interests:43")
		loader := &plSQL{db: d.db, before: func(context.Context) { e.set(t, key, "+9 +old ") }}
		w := e.writer(t, loader, nil, Config{})
		op := plAppend(d.setRule, key, "-old +new ")
		op.Args = []rules.Value{plInt(43)}
		plWant(t, plApplyOne(t, w, op), OutcomeAppended)
		e.wantValue(t, key, "+9 +old -old +new ")
	})

	t.Run("load fails", func(t *testing.T) {
		key := e.key("interests:44")
		loader := &plSQL{db: d.db, before: func(context.Context) { e.set(t, key, "+created-meanwhile ") }}
		w := e.writer(t, loader, nil, Config{})
		op := plAdd(d.badSetRule, key, "x")
		op.Args = []rules.Value{plInt(44)}
		plWant(t, plApplyOne(t, w, op), OutcomeDeleted)
		e.wantMissing(t, key)
		if s := w.Stats(); s.LoadErrors != 1 || s.Deletes != 1 {
			t.Errorf("stats = %+v", s)
		}
	})

	t.Run("load cancelled", func(t *testing.T) {
		key := e.key("interests:45")
		ctx, cancel := context.WithCancel(context.Background())
		loader := &plSQL{db: d.db, before: func(context.Context) { cancel() }}
		w := e.writer(t, loader, nil, Config{})
		op := plAdd(d.setRule, key, "x")
		op.Args = []rules.Value{plInt(45)}
		results := make([]Result, 1)
		err := w.Apply(ctx, []rules.Op{op}, results)
		if !errors.Is(err, context.Canceled) || Retryable(err) {
			t.Fatalf("Apply = %v, want a cancelled, not retryable error", err)
		}
		e.wantMissing(t, key)
	})
}

// plBigSet returns a set value of about size bytes.
func plBigSet(size int, dirty bool) string {
	var b strings.Builder
	b.WriteString("+keep +keep2 ")
	for i := 0; b.Len() < size-40; i++ {
		if dirty {
			fmt.Fprintf(&b, "+filler%07d -filler%07d ", i, i)
		} else {
			fmt.Fprintf(&b, "+filler%07d ", i)
		}
	}
	return b.String()
}

func TestPipelineSetTooLarge(t *testing.T) {
	e := newPLEnv(t)
	limit := plItemSizeMax(t, e.addr)
	w := e.writer(t, nil, nil, Config{})

	// A dirty set that cannot grow is compacted, and the append succeeds.
	dirty := e.key("set:big:dirty")
	e.set(t, dirty, plBigSet(limit-8192, true))
	tokens := strings.Repeat("+more -more ", 1500) + "+added "
	plWant(t, plApplyOne(t, w, plAppend(plSetRule, dirty, tokens)), OutcomeCompacted)
	e.wantValue(t, dirty, "+keep +keep2 "+tokens)
	if s := w.Stats(); s.Compactions != 1 || s.Commands != 4 {
		t.Errorf("stats = %+v, want 1 compaction in 4 commands (append, mg, cas, append)", s)
	}

	// A clean one is deleted.
	clean := e.key("set:big:clean")
	e.set(t, clean, plBigSet(limit-8192, false))
	plWant(t, plApplyOne(t, w, plAppend(plSetRule, clean, strings.Repeat("+more ", 3000))), OutcomeDeleted)
	e.wantMissing(t, clean)

	// Tokens larger than an item: the set goes, a missing one stays
	// missing. (memcached 1.6 itself drops an item whose meta append it
	// refuses as too large, which the writer then finds missing; a server
	// that keeps it makes the writer delete it.)
	huge := strings.Repeat("+0123456789 ", limit/12+10)
	small, none := e.key("set:small"), e.key("set:none")
	e.set(t, small, "+a -a +b ")
	results, _ := plApply(t, w, plAppend(plSetRule, small, huge), plAppend(plSetRule, none, huge))
	if o := results[0].Outcome; o != OutcomeDeleted && o != OutcomeMissing {
		t.Errorf("set that cannot take the tokens: %v (%v), want deleted or missing", o, results[0].Err)
	}
	plWant(t, results[1], OutcomeMissing)
	e.wantMissing(t, small)
	e.wantMissing(t, none)
}

func TestPipelineSampledCompaction(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{CompactSample: 1, CompactRatio: 0.5})
	dirty, clean := e.key("set:dirty"), e.key("set:clean")
	e.set(t, dirty, "+a -a +b -b +c ")
	e.set(t, clean, "+a +b ")
	results, err := plApply(t, w, plAdd(plSetRule, dirty, "d"), plAdd(plSetRule, clean, "c"))
	if err != nil {
		t.Fatal(err)
	}
	plWant(t, results[0], OutcomeCompacted)
	plWant(t, results[1], OutcomeAppended)
	e.wantValue(t, dirty, "+c +d ")
	e.wantValue(t, clean, "+a +b +c ")
	if ttl := plTTL(t, e.addr, dirty); ttl < 7190 || ttl > 7200 {
		t.Errorf("ttl of the compacted set = %d, want the rule's 7200", ttl)
	}
}

func TestPipelineCounters(t *testing.T) {
	e := newPLEnv(t)
	d := newPLDB(t)
	rc := &plSQL{db: d.db}
	w := e.writer(t, nil, rc, Config{})
	post9, post10 := []rules.Value{plInt(9)}, []rules.Value{plInt(10)}

	incr, decr, toZero := e.key("c:incr"), e.key("c:decr"), e.key("c:zero")
	missing, noQuery, junk := e.key("c:missing"), e.key("c:noquery"), e.key("c:junk")
	recount, recountBad, recountNone := e.key("c:recount"), e.key("c:recount-bad"), e.key("c:recount-none")
	zeroDelta := e.key("c:zero-delta")
	e.set(t, incr, "5")
	e.set(t, decr, "5")
	e.set(t, toZero, "2")
	e.set(t, junk, "abc")
	e.set(t, recount, "77")
	e.set(t, recountBad, "77")
	e.set(t, recountNone, "77")
	ops := []rules.Op{
		plCount(d.countRule, incr, 3, post9...),
		plCount(d.countRule, decr, -2, post9...),
		plCount(d.countRule, toZero, -2, post9...),
		plCount(d.countRule, missing, 1, post9...),
		plCount(plCountRule, noQuery, 1),
		plCount(d.countRule, junk, 1, post10...),
		plRecount(d.countRule, recount, post9...),
		plRecount(d.badRule, recountBad, post9...),
		plRecount(plCountRule, recountNone),
		plCount(d.countRule, zeroDelta, 0, post9...),
	}
	results, err := plApply(t, w, ops...)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{OutcomeIncr, OutcomeDecr, OutcomeRecounted, OutcomeLoaded, OutcomeMissing,
		OutcomeRecounted, OutcomeRecounted, OutcomeDeleted, OutcomeDeleted, OutcomeIncr}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Errorf("op %d (%s %s): %v (%v), want %v", i, ops[i].Kind, ops[i].Key, r.Outcome, r.Err, want[i])
		}
	}
	e.wantValue(t, incr, "8")
	e.wantValue(t, decr, "3")
	e.wantValue(t, toZero, "3") // recounted: post 9 has 3 comments
	e.wantValue(t, missing, "3")
	e.wantMissing(t, noQuery)
	e.wantValue(t, junk, "1")
	e.wantValue(t, recount, "3")
	e.wantMissing(t, recountBad)
	e.wantMissing(t, recountNone)
	e.wantMissing(t, zeroDelta)
	if ttl := plTTL(t, e.addr, missing); ttl < 3590 || ttl > 3600 {
		t.Errorf("ttl of an added counter = %d, want the rule's 3600", ttl)
	}
	if s := w.Stats(); s.Recounts != 5 || s.RecountErrors != 1 || s.Drifts != 2 || s.Deletes != 2 {
		t.Errorf("stats = %+v", s)
	}

	t.Run("add loses a race", func(t *testing.T) {
		key := e.key("c:race")
		rc := &plSQL{db: d.db, before: func(context.Context) { e.set(t, key, "40") }}
		w := e.writer(t, nil, rc, Config{})
		plWant(t, plApplyOne(t, w, plCount(d.countRule, key, 2, post9...)), OutcomeIncr)
		e.wantValue(t, key, "42")
		key2 := e.key("c:race-decr")
		rc.before = func(context.Context) { e.set(t, key2, "40") }
		plWant(t, plApplyOne(t, w, plCount(d.countRule, key2, -1, post9...)), OutcomeDecr)
		e.wantValue(t, key2, "39")
	})

	t.Run("decrement to zero, recount fails", func(t *testing.T) {
		key := e.key("c:zero-bad")
		e.set(t, key, "1")
		w := e.writer(t, nil, rc, Config{})
		plWant(t, plApplyOne(t, w, plCount(d.badRule, key, -1, post9...)), OutcomeDeleted)
		e.wantMissing(t, key)
	})
}

// TestPipelineSameKeyInOrder: ops that share a key are applied in slice
// order, each complete (miss path included) before the next.
func TestPipelineSameKeyInOrder(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{})
	set, ns, other := e.key("set:order"), e.key("ns:order"), e.key("set:other")
	e.set(t, set, "+x ")
	e.set(t, other, "+o ")
	results, err := plApply(t, w,
		plAppend(plSetRule, set, "+a "),
		plBump(ns),
		plAppend(plSetRule, set, "-a "),
		plAdd(plSetRule, other, "p"),
		plBump(ns),
		plAppend(plSetRule, set, "+b "),
	)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []Outcome{OutcomeAppended, OutcomeAdded, OutcomeAppended, OutcomeAppended, OutcomeIncr, OutcomeAppended} {
		plWant(t, results[i], want)
	}
	e.wantValue(t, set, "+x +a -a +b ")
	e.wantValue(t, ns, strconv.FormatUint(itemformat.NamespaceStart(plClock)+1, 10))
	if s := w.Stats(); s.Rounds != 3 {
		t.Errorf("rounds = %d, want 3 (one per occurrence of the key)", s.Rounds)
	}
}

func TestPipelineRejectsInvalidOps(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{})
	ops := []rules.Op{
		{Kind: rules.OpBump, Key: e.key("no-rule")},
		plBump(e.key("has space")),
		plBump(""),
		plBump(strings.Repeat("k", 251)),
		plAppend(plSetRule, e.key("s"), "+a"),
		plAppend(plSetRule, e.key("s"), "a "),
		plAppend(plSetRule, e.key("s"), "+a\r\nmn "),
		{Kind: rules.OpSetAdd, Rule: plSetRule, Key: e.key("s"), Member: "raw member"},
		{Kind: 99, Rule: plSetRule, Key: e.key("s")},
	}
	results, err := plApply(t, w, ops...)
	if err == nil || Retryable(err) {
		t.Fatalf("Apply = %v, want a permanent error", err)
	}
	for i, r := range results {
		if r.Outcome != OutcomeFailed || Retryable(r.Err) {
			t.Errorf("op %d: %v (%v), want a permanent failure", i, r.Outcome, r.Err)
		}
	}
	if s := w.Stats(); s.Commands != 0 || s.Dials != 0 {
		t.Errorf("stats = %+v, want nothing sent", s)
	}
	results = make([]Result, 1)
	if err := w.Apply(context.Background(), ops[:2], results); !errors.Is(err, ErrInvalidOp) {
		t.Errorf("short results: %v", err)
	}
}

// TestPipelineRoutingMatchesGomemcache writes through the pipeline over
// three servers and reads through gomemcache with the same server list:
// every key is where gomemcache looks for it, and only there.
func TestPipelineRoutingMatchesGomemcache(t *testing.T) {
	addrs := []string{testsvc.Memcached(t), testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{}).Addr, testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{}).Addr}
	e := newPLEnv(t, addrs...)
	w := e.writer(t, nil, nil, Config{MinCommandsPerConn: 16})
	var ops []rules.Op
	var bumps, sets []string
	for i := range 300 {
		key := e.key("ns:" + strconv.Itoa(i))
		bumps = append(bumps, key)
		ops = append(ops, plBump(key))
	}
	for i := range 90 {
		key := e.key("set:" + strconv.Itoa(i))
		sets = append(sets, key)
		e.set(t, key, "+x ")
		ops = append(ops, plAdd(plSetRule, key, "y"))
	}
	if _, err := plApply(t, w, ops...); err != nil {
		t.Fatal(err)
	}
	items, err := e.mc.GetMulti(append(append([]string(nil), bumps...), sets...))
	if err != nil {
		t.Fatal(err)
	}
	clock := strconv.FormatUint(itemformat.NamespaceStart(plClock), 10)
	for _, key := range bumps {
		if it := items[key]; it == nil || string(it.Value) != clock {
			t.Fatalf("gomemcache does not find bump %s where the pipeline wrote it: %v", key, it)
		}
	}
	for _, key := range sets {
		if it := items[key]; it == nil || string(it.Value) != "+x +y " {
			t.Fatalf("gomemcache does not find set %s as appended: %v", key, it)
		}
	}
	// Each server holds exactly the keys PickServer gives it, and each
	// holds some.
	perServer := make(map[string]int)
	for _, addr := range addrs {
		direct := memcache.New(addr)
		for _, key := range bumps {
			picked, err := e.servers.PickServer(key)
			if err != nil {
				t.Fatal(err)
			}
			_, err = direct.Get(key)
			onServer := err == nil
			if onServer != (picked.String() == addr) {
				t.Fatalf("%s on %s: %v, but PickServer says %s", key, addr, err, picked)
			}
			if onServer {
				perServer[addr]++
			}
		}
		direct.Close()
	}
	for _, addr := range addrs {
		if perServer[addr] == 0 {
			t.Errorf("no key on %s: %v", addr, perServer)
		}
	}
	if s := w.Stats(); s.Rounds != 1 || s.RoundTrips < 3 {
		t.Errorf("stats = %+v, want one round over every server", s)
	}
}

// plProxy forwards connections to a memcached. cut makes it close the
// next connection after forwarding that many request bytes; stall makes
// it drop every reply.
type plProxy struct {
	addr  string
	cut   atomic.Int64
	stall atomic.Bool
	conns atomic.Int64
	// inject turns the next success reply to a store (STORED, HD) into
	// "SERVER_ERROR out of memory storing object", as memcached answers
	// when it is out of memory.
	inject atomic.Bool
}

func startPLProxy(t *testing.T, target string) *plProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &plProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.conns.Add(1)
			mu.Lock()
			open = append(open, client, server)
			mu.Unlock()
			cut := p.cut.Swap(0)
			wg.Go(func() {
				if cut > 0 {
					io.CopyN(server, client, cut)
					// Let memcached answer what it got, then cut.
					time.Sleep(100 * time.Millisecond)
					client.Close()
					server.Close()
					return
				}
				io.Copy(server, client)
				server.Close()
			})
			wg.Go(func() {
				if p.stall.Load() {
					io.Copy(io.Discard, server)
				} else {
					p.copyReplies(client, server)
				}
				client.Close()
			})
		}
	})
	return p
}

// copyReplies copies memcached's replies line by line (a data block
// passes as lines too), injecting a server error when inject is set.
func (p *plProxy) copyReplies(client io.Writer, server io.Reader) {
	r := bufio.NewReader(server)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			if (line == "STORED\r\n" || strings.HasPrefix(line, "HD ")) && p.inject.CompareAndSwap(true, false) {
				line = "SERVER_ERROR out of memory storing object\r\n"
			}
			if _, werr := io.WriteString(client, line); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// plMixedBatch returns bumps, set appends and counter deltas on existing
// items (counters start at 1000).
func plMixedBatch(t testing.TB, e *plEnv, n int) []rules.Op {
	t.Helper()
	var ops []rules.Op
	for i := range n {
		switch i % 3 {
		case 0:
			ops = append(ops, plBump(e.key("ns:"+strconv.Itoa(i))))
		case 1:
			key := e.key("set:" + strconv.Itoa(i))
			e.set(t, key, "+x ")
			ops = append(ops, plAdd(plSetRule, key, "y"))
		default:
			key := e.key("c:" + strconv.Itoa(i))
			e.set(t, key, "1000")
			ops = append(ops, plCount(plCountRule, key, 1))
		}
	}
	return ops
}

// checkLostReplies checks the results of a batch whose connection broke:
// every op either succeeded or failed retryably, the counter deltas that
// failed with ErrUnknownOutcome, the others without it.
func checkLostReplies(t *testing.T, ops []rules.Op, results []Result, err error) (failed int) {
	t.Helper()
	if err == nil || !Retryable(err) {
		t.Fatalf("Apply = %v, want a retryable error", err)
	}
	for i, r := range results {
		if r.Err == nil {
			continue
		}
		failed++
		if !Retryable(r.Err) {
			t.Errorf("op %d (%s): %v, want a retryable error", i, ops[i].Kind, r.Err)
		}
		if unknown := errors.Is(r.Err, ErrUnknownOutcome); unknown != (ops[i].Kind == rules.OpCount) {
			t.Errorf("op %d (%s): %v; ErrUnknownOutcome %v", i, ops[i].Kind, r.Err, unknown)
		}
	}
	return failed
}

// TestPipelineConnectionKilled cuts the connection in the middle of a
// batch: the ops without a reply fail retryably, counter deltas with
// ErrUnknownOutcome; the writer recovers on a new connection.
func TestPipelineConnectionKilled(t *testing.T) {
	e := newPLEnv(t)
	proxy := startPLProxy(t, e.addr)
	pe := *e
	pe.servers = new(memcache.ServerList)
	pe.servers.SetServers(proxy.addr)
	w := pe.writer(t, nil, nil, Config{Meta: metaproto.PoolConfig{ConnsPerServer: 1}})
	ops := plMixedBatch(t, e, 600)
	proxy.cut.Store(6000) // the batch is about 20k bytes
	results := make([]Result, len(ops))
	err := w.Apply(context.Background(), ops, results)
	failed := checkLostReplies(t, ops, results, err)
	if failed == 0 || failed == len(ops) {
		t.Errorf("%d of %d ops failed; the cut should fall mid-batch", failed, len(ops))
	}
	if s := w.Stats(); s.BrokenConns != 1 {
		t.Errorf("stats = %+v, want one broken connection", s)
	}
	// The consumer retries: bumps and appends as they are, counter deltas
	// as recounts; on a new connection everything succeeds.
	for i := range ops {
		if results[i].Err == nil {
			continue
		}
		retry := ops[i]
		if errors.Is(results[i].Err, ErrUnknownOutcome) {
			retry = plRecount(plCountRule, retry.Key)
		}
		if r := plApplyOne(t, w, retry); r.Err != nil {
			t.Fatalf("retry of op %d: %v", i, r.Err)
		}
	}
	if proxy.conns.Load() != 2 {
		t.Errorf("proxy saw %d connections, want 2", proxy.conns.Load())
	}
}

// TestPipelineStalledServer: a server that stops answering fails the
// exchange after Timeout.
func TestPipelineStalledServer(t *testing.T) {
	e := newPLEnv(t)
	proxy := startPLProxy(t, e.addr)
	proxy.stall.Store(true)
	pe := *e
	pe.servers = new(memcache.ServerList)
	pe.servers.SetServers(proxy.addr)
	w := pe.writer(t, nil, nil, Config{Meta: metaproto.PoolConfig{Timeout: 200 * time.Millisecond}})
	ops := plMixedBatch(t, e, 30)
	results := make([]Result, len(ops))
	err := w.Apply(context.Background(), ops, results)
	if failed := checkLostReplies(t, ops, results, err); failed != len(ops) {
		t.Errorf("%d of %d ops failed, want all", failed, len(ops))
	}
	if !strings.Contains(err.Error(), "no complete reply within 200ms") {
		t.Errorf("error does not name the timeout: %v", err)
	}
}

func TestPipelineMemcachedDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var sl memcache.ServerList
	sl.SetServers(addr)
	w := NewMetaApplier(&sl, nil, nil, Config{}, nil)
	defer w.Close()
	ops := []rules.Op{plBump("ns:1"), plAdd(plSetRule, "set:1", "m"), plCount(plCountRule, "c:1", 1)}
	results := make([]Result, len(ops))
	err = w.Apply(context.Background(), ops, results)
	if err == nil || !Retryable(err) {
		t.Fatalf("Apply = %v, want a retryable error", err)
	}
	for i, r := range results {
		// Nothing was sent: no outcome is unknown.
		if r.Outcome != OutcomeFailed || !Retryable(r.Err) || errors.Is(r.Err, ErrUnknownOutcome) {
			t.Errorf("op %d: %v (%v)", i, r.Outcome, r.Err)
		}
	}
	if !strings.Contains(results[0].Err.Error(), `cacheops: incr "ns:1"`) || !strings.Contains(results[1].Err.Error(), `cacheops: append "set:1"`) {
		t.Errorf("errors lack context: %v; %v", results[0].Err, results[1].Err)
	}
}

func TestPipelineApplyCanceled(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := e.key("ns:canceled")
	results := make([]Result, 1)
	err := w.Apply(ctx, []rules.Op{plBump(key)}, results)
	if !errors.Is(err, context.Canceled) || Retryable(err) || results[0].Outcome != OutcomeFailed {
		t.Fatalf("Apply = %v, %+v", err, results[0])
	}
	e.wantMissing(t, key)
	if s := w.Stats(); s.Commands != 0 {
		t.Errorf("commands = %d, want none", s.Commands)
	}
}

// TestPipelineMatchesWriter applies the same ops through the text and
// the meta Applier, on items in the same states, and compares outcomes and
// the items left behind.
func TestPipelineMatchesWriter(t *testing.T) {
	d := newPLDB(t)
	type state struct {
		key, value string // "" value: missing
	}
	seed := []state{
		{"ns:hit", "5"}, {"ns:miss", ""}, {"ns:junk", "x"},
		{"set:hit", "+a "}, {"set:miss", ""}, {"set:load", ""}, {"set:load-fails", ""},
	}
	build := func(e *plEnv) []rules.Op {
		load := plAdd(d.setRule, e.key("set:load"), "7")
		load.Args = []rules.Value{plInt(42)}
		fails := plAdd(d.badSetRule, e.key("set:load-fails"), "7")
		fails.Args = []rules.Value{plInt(42)}
		return []rules.Op{
			plBump(e.key("ns:hit")), plBump(e.key("ns:miss")), plBump(e.key("ns:junk")),
			plAppend(plSetRule, e.key("set:hit"), "+b -a "), plAdd(plSetRule, e.key("set:miss"), "m"),
			load, fails,
		}
	}
	run := func(apply func(*plEnv, []rules.Op) []Result) ([]Result, []string) {
		e := newPLEnv(t)
		for _, s := range seed {
			if s.value != "" {
				e.set(t, e.key(s.key), s.value)
			}
		}
		results := apply(e, build(e))
		var items []string
		for _, s := range seed {
			v, ok := e.value(t, e.key(s.key))
			items = append(items, fmt.Sprintf("%s=%q/%v", s.key, v, ok))
		}
		return results, items
	}
	loader := &plSQL{db: d.db}
	wantResults, wantItems := run(func(e *plEnv, ops []rules.Op) []Result {
		w := NewTextApplier(e.mc, loader, nil, Config{CompactSample: -1, Now: func() time.Time { return plClock }}, nil)
		results := make([]Result, len(ops))
		w.Apply(context.Background(), ops, results)
		return results
	})
	gotResults, gotItems := run(func(e *plEnv, ops []rules.Op) []Result {
		w := e.writer(t, loader, nil, Config{})
		results := make([]Result, len(ops))
		w.Apply(context.Background(), ops, results)
		return results
	})
	for i := range wantResults {
		if gotResults[i].Outcome != wantResults[i].Outcome || (gotResults[i].Err == nil) != (wantResults[i].Err == nil) {
			t.Errorf("op %d (%s): pipeline %v (%v), writer %v (%v)", i, seed[i].key,
				gotResults[i].Outcome, gotResults[i].Err, wantResults[i].Outcome, wantResults[i].Err)
		}
		if gotItems[i] != wantItems[i] {
			t.Errorf("item after op %d: pipeline %s, writer %s", i, gotItems[i], wantItems[i])
		}
	}
}

// TestPipelineResendsUnplacedErrors: memcached's error lines carry no
// opaque token. Two non-numeric namespaces among quiet bumps send two
// errors that could belong to any two of the three bumps, so all three are
// sent again, loud; the numeric one is bumped twice, which is harmless.
func TestPipelineResendsUnplacedErrors(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{})
	junk1, number, junk2 := e.key("ns:junk1"), e.key("ns:number"), e.key("ns:junk2")
	e.set(t, junk1, "x")
	e.set(t, number, "10")
	e.set(t, junk2, "y")
	results, err := plApply(t, w, plBump(junk1), plBump(number), plBump(junk2))
	if err != nil {
		t.Fatal(err)
	}
	plWant(t, results[0], OutcomeDeleted)
	plWant(t, results[1], OutcomeIncr)
	plWant(t, results[2], OutcomeDeleted)
	e.wantMissing(t, junk1)
	e.wantMissing(t, junk2)
	e.wantValue(t, number, "12")
	// Quiet bumps, the same bumps loud, the deletes.
	if s := w.Stats(); s.Rounds != 3 || s.Commands != 8 {
		t.Errorf("stats = %+v, want 8 commands in 3 rounds", s)
	}
}

// TestPipelineProbe: a memcached with the meta protocol passes; a server
// that answers ERROR to meta commands (memcached before 1.6, or a proxy
// that does not route them) fails with ErrNoMetaProtocol, naming it.
func TestPipelineProbe(t *testing.T) {
	e := newPLEnv(t)
	if err := e.writer(t, nil, nil, Config{}).Probe(context.Background()); err != nil {
		t.Fatalf("real memcached: %v", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					io.WriteString(c, "ERROR\r\n")
				}
			}()
		}
	}()
	var list memcache.ServerList
	if err := list.SetServers(ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	w := NewMetaApplier(&list, nil, nil, Config{}, nil)
	defer w.Close()
	err = w.Probe(context.Background())
	if !errors.Is(err, ErrNoMetaProtocol) || !strings.Contains(err.Error(), ln.Addr().String()) || !strings.Contains(err.Error(), "memcached.protocol: text") {
		t.Fatalf("text-only server: %v, want ErrNoMetaProtocol naming %s and memcached.protocol: text", err, ln.Addr())
	}
}

// TestPipelineRecountElsewhere: with RecountElsewhere the writer applies
// the deltas it can and leaves every recount to its caller, sending
// nothing for a recount op and running no query.
func TestPipelineRecountElsewhere(t *testing.T) {
	e := newPLEnv(t)
	w := e.writer(t, nil, nil, Config{RecountElsewhere: true})
	rule := &rules.Rule{Name: "count-q", Kind: rules.CountRule, Query: "SELECT COUNT(*) FROM comments WHERE post_id = ?"}
	incr, toZero, missing := e.key("e:incr"), e.key("e:zero"), e.key("e:missing")
	noQuery, junk, recount := e.key("e:noquery"), e.key("e:junk"), e.key("e:recount")
	e.set(t, incr, "5")
	e.set(t, toZero, "2")
	e.set(t, junk, "abc")
	e.set(t, recount, "77")
	ops := []rules.Op{
		plCount(rule, incr, 3, plInt(9)),
		plCount(rule, toZero, -2, plInt(9)),
		plCount(rule, missing, 1, plInt(9)),
		plCount(plCountRule, noQuery, 1),
		plCount(rule, junk, 1, plInt(9)),
		plRecount(rule, recount, plInt(9)),
	}
	results, err := plApply(t, w, ops...)
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{OutcomeIncr, OutcomeRecountNeeded, OutcomeRecountNeeded, OutcomeMissing, OutcomeRecountNeeded, OutcomeRecountNeeded}
	for i, r := range results {
		if r.Outcome != want[i] || r.Err != nil {
			t.Errorf("op %d (%s %s): %v (%v), want %v", i, ops[i].Kind, ops[i].Key, r.Outcome, r.Err, want[i])
		}
	}
	e.wantValue(t, incr, "8")
	e.wantValue(t, toZero, "0") // clamped: the caller recounts it
	e.wantMissing(t, missing)
	e.wantMissing(t, noQuery)
	e.wantValue(t, junk, "abc")
	e.wantValue(t, recount, "77")
	if s := w.Stats(); s.Recounts != 0 || s.Commands != 5 {
		t.Errorf("stats = %+v, want no recount and one command per delta", s)
	}
}
