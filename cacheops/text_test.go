package cacheops

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// wtClock is the fixed clock of the writer tests: new namespaces start at
// its unix milliseconds.
var wtClock = time.UnixMilli(1_700_000_000_123)

type wtEnv struct {
	addr   string
	mc     *memcache.Client
	prefix string
}

func newWTEnv(t testing.TB) *wtEnv {
	t.Helper()
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	mc.MaxIdleConns = 64
	mc.Timeout = 2 * time.Second
	t.Cleanup(func() { mc.Close() })
	return &wtEnv{addr: addr, mc: mc, prefix: "cwtest:" + testsvc.Unique() + ":"}
}

func (e *wtEnv) key(name string) string { return e.prefix + name }

func (e *wtEnv) writer(loader SetLoader, cfg Config) *Applier {
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return wtClock }
	}
	if cfg.CompactSample == 0 {
		cfg.CompactSample = -1 // tests that want sampled compaction say so
	}
	return NewTextApplier(e.mc, loader, nil, cfg, nil)
}

func (e *wtEnv) set(t testing.TB, key, value string, ttl int32) {
	t.Helper()
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte(value), Expiration: ttl}); err != nil {
		t.Fatalf("set %q: %v", key, err)
	}
}

// value returns the item's value, or ok false when it is missing.
func (e *wtEnv) value(t testing.TB, key string) (string, bool) {
	t.Helper()
	return itemValue(t, e.mc, key)
}

// itemValue returns the value of the item at key, or ok false when it is
// missing; other errors fail the test.
func itemValue(t testing.TB, mc *memcache.Client, key string) (string, bool) {
	t.Helper()
	it, err := mc.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return "", false
	}
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return string(it.Value), true
}

// raw sends one request line (and data) on its own connection and returns
// the first response line.
func (e *wtEnv) raw(t testing.TB, request string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", e.addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	return strings.TrimRight(line, "\r\n")
}

// ttl returns the item's remaining TTL in seconds (-1: none), read with
// the meta protocol, which gomemcache lacks.
func (e *wtEnv) ttl(t testing.TB, key string) int {
	t.Helper()
	line := e.raw(t, "mg "+key+" t\r\n")
	rest, ok := strings.CutPrefix(line, "HD t")
	if !ok {
		t.Fatalf("mg %s t: %q", key, line)
	}
	n, err := strconv.Atoi(rest)
	if err != nil {
		t.Fatalf("mg %s t: %q", key, line)
	}
	return n
}

// itemSizeMax returns the server's item size limit in bytes.
func (e *wtEnv) itemSizeMax(t testing.TB) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", e.addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	conn.Write([]byte("stats settings\r\n"))
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
		if f[0] == "END" {
			break
		}
	}
	t.Fatal("stats settings: no item_size_max")
	return 0
}

// apply applies ops and fails the test on a short result slice.
func apply(t testing.TB, w *Applier, ops ...rules.Op) ([]Result, error) {
	t.Helper()
	results := make([]Result, len(ops))
	err := w.Apply(context.Background(), ops, results)
	return results, err
}

// applyResult applies one op; safe to call from any goroutine.
func applyResult(w *Applier, op rules.Op) Result {
	results := make([]Result, 1)
	w.Apply(context.Background(), []rules.Op{op}, results)
	return results[0]
}

func applyOne(t testing.TB, w *Applier, op rules.Op) Result {
	t.Helper()
	results, err := apply(t, w, op)
	if (err != nil) != (results[0].Err != nil) {
		t.Fatalf("Apply error %v, but result %+v", err, results[0])
	}
	return results[0]
}

func wantOutcome(t testing.TB, r Result, want Outcome) {
	t.Helper()
	if r.Outcome != want || (r.Err != nil) != (want == OutcomeFailed) {
		t.Fatalf("result = %v (%v), want %v", r.Outcome, r.Err, want)
	}
}

var (
	wtBumpRule = &rules.Rule{Name: "ns", TTL: time.Hour}
	wtSetRule  = &rules.Rule{Name: "set", TTL: 2 * time.Hour}
)

func bumpOp(key string) rules.Op { return rules.Op{Kind: rules.OpBump, Rule: wtBumpRule, Key: key} }

func setAddOp(rule *rules.Rule, key, member string) rules.Op {
	return rules.Op{Kind: rules.OpSetAdd, Rule: rule, Key: key, Member: rules.Escape(member)}
}

func setRemoveOp(rule *rules.Rule, key, member string) rules.Op {
	return rules.Op{Kind: rules.OpSetRemove, Rule: rule, Key: key, Member: rules.Escape(member)}
}

func setAppendOp(rule *rules.Rule, key, tokens string) rules.Op {
	return rules.Op{Kind: rules.OpSetAppend, Rule: rule, Key: key, Tokens: tokens}
}

func TestWriterBumpExisting(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("ns:1")
	e.set(t, key, "100", 0)
	wantOutcome(t, applyOne(t, w, bumpOp(key)), OutcomeIncr)
	if v, _ := e.value(t, key); v != "101" {
		t.Fatalf("value = %q, want 101", v)
	}
	if got := w.Stats().Commands; got != 1 {
		t.Errorf("calls = %d, want 1", got)
	}
}

func TestWriterBumpMissing(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("ns:2")
	wantOutcome(t, applyOne(t, w, bumpOp(key)), OutcomeAdded)
	if v, _ := e.value(t, key); v != strconv.FormatUint(itemformat.NamespaceStart(wtClock), 10) {
		t.Fatalf("value = %q, want the clock's start version %d", v, itemformat.NamespaceStart(wtClock))
	}
	if ttl := e.ttl(t, key); ttl < 3590 || ttl > 3600 {
		t.Errorf("ttl = %d, want the rule's 3600", ttl)
	}
	if got := w.Stats().Commands; got != 2 {
		t.Errorf("calls = %d, want 2 (incr, add)", got)
	}

	noTTL := &rules.Rule{Name: "forever"}
	key2 := e.key("ns:3")
	wantOutcome(t, applyOne(t, w, rules.Op{Kind: rules.OpBump, Rule: noTTL, Key: key2}), OutcomeAdded)
	if ttl := e.ttl(t, key2); ttl != -1 {
		t.Errorf("ttl = %d, want none (-1)", ttl)
	}
}

// TestWriterBumpConcurrentMissing bumps one missing namespace from many
// goroutines: exactly one add wins, every other bump is an incr (the
// losers of the add race incr the winner's value), so the final value is
// the clock's start version plus every bump but the creating one.
func TestWriterBumpConcurrentMissing(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("ns:hot")
	const goroutines, bumps = 16, 40
	var added, incrs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range goroutines {
		wg.Go(func() {
			<-start
			for range bumps {
				r := applyResult(w, bumpOp(key))
				switch r.Outcome {
				case OutcomeAdded:
					added.Add(1)
				case OutcomeIncr:
					incrs.Add(1)
				default:
					t.Errorf("bump: %v (%v)", r.Outcome, r.Err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if added.Load() != 1 || incrs.Load() != goroutines*bumps-1 {
		t.Errorf("added %d, incr %d; want 1 and %d", added.Load(), incrs.Load(), goroutines*bumps-1)
	}
	want := strconv.FormatUint(itemformat.NamespaceStart(wtClock)+goroutines*bumps-1, 10)
	if v, _ := e.value(t, key); v != want {
		t.Errorf("value = %s, want %s", v, want)
	}
}

func TestWriterBumpNonNumeric(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("ns:junk")
	e.set(t, key, "not a number", 0)
	wantOutcome(t, applyOne(t, w, bumpOp(key)), OutcomeDeleted)
	if _, ok := e.value(t, key); ok {
		t.Fatal("namespace with a non-numeric value was kept")
	}
}

func TestWriterSetAppend(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	k1, k2, k3 := e.key("set:1"), e.key("set:2"), e.key("set:3")
	e.set(t, k1, "+a ", 0)
	e.set(t, k2, "+x ", 0)
	e.set(t, k3, "+y +z ", 0)
	results, err := apply(t, w,
		setAppendOp(wtSetRule, k1, "+b -a +c%20d "),
		setAddOp(wtSetRule, k2, "new member"),
		setRemoveOp(wtSetRule, k3, "y"),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		wantOutcome(t, r, OutcomeAppended)
	}
	for key, want := range map[string]string{
		k1: "+a +b -a +c%20d ",
		k2: "+x +new%20member ",
		k3: "+y +z -y ",
	} {
		if v, _ := e.value(t, key); v != want {
			t.Errorf("%s = %q, want %q", key, v, want)
		}
	}
	if got := w.Stats().Commands; got != 3 {
		t.Errorf("calls = %d, want one append per op", got)
	}
}

func TestWriterSetMissingWithoutLoad(t *testing.T) {
	e := newWTEnv(t)
	withQuery := &rules.Rule{Name: "loaded", Query: "SELECT 1"}
	for _, tc := range []struct {
		name string
		w    *Applier
		rule *rules.Rule
	}{
		{"rule without load", e.writer(loaderFunc(failIfCalled(t)), Config{}), wtSetRule},
		{"writer without loader", e.writer(nil, Config{}), withQuery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := e.key("set:missing:" + rules.Escape(tc.name))
			wantOutcome(t, applyOne(t, tc.w, setAddOp(tc.rule, key, "m")), OutcomeMissing)
			if _, ok := e.value(t, key); ok {
				t.Fatal("a missing set was created")
			}
		})
	}
}

type loaderFunc func(ctx context.Context, query string, args []rules.Value) ([]string, error)

func (f loaderFunc) LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error) {
	return f(ctx, query, args)
}

func failIfCalled(t *testing.T) loaderFunc {
	return func(context.Context, string, []rules.Value) ([]string, error) {
		t.Error("loader called")
		return nil, errors.New("loader called")
	}
}

// sqlLoader is a SetLoader over database/sql; before, when set, runs
// first (to simulate what other clients do meanwhile).
type sqlLoader struct {
	db     *sql.DB
	before func(ctx context.Context)
}

func (l *sqlLoader) LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error) {
	if l.before != nil {
		l.before(ctx)
	}
	vals := make([]any, len(args))
	for i, a := range args {
		if !a.IsNull() {
			vals[i] = a.Text
		}
	}
	rows, err := l.db.QueryContext(ctx, query, vals...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var members []string
	for rows.Next() {
		var m []byte
		if err := rows.Scan(&m); err != nil {
			return nil, err
		}
		members = append(members, string(m))
	}
	return members, rows.Err()
}

// interestsDB creates a table of user interests and returns the loader
// and the set rule that loads a user's interests.
func interestsDB(t *testing.T) (*sql.DB, *rules.Rule) {
	t.Helper()
	db, _ := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE user_interests (user_id INT NOT NULL, interest VARCHAR(64) NOT NULL, PRIMARY KEY (user_id, interest))",
		"INSERT INTO user_interests VALUES (42, '7'), (42, 'rock climbing'), (42, '100%'), (42, 'café'), (43, '9')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	rule := &rules.Rule{Name: "interests", TTL: 90 * time.Minute,
		Query: "SELECT interest FROM user_interests WHERE user_id = ? ORDER BY interest"}
	return db, rule
}

var user42 = []rules.Value{{Kind: rules.KindInt, Text: "42"}}

func TestWriterSetLoad(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	w := e.writer(&sqlLoader{db: db}, Config{})
	key := e.key("interests:42")
	// The removal of "gone" is already reflected in MySQL: the loaded set
	// is stored as it is, without the op's tokens.
	op := setAppendOp(rule, key, "+7 -gone ")
	op.Args = user42
	wantOutcome(t, applyOne(t, w, op), OutcomeLoaded)
	want := "+100%25 +7 +caf\u00e9 +rock%20climbing "
	if v, _ := e.value(t, key); v != want {
		t.Fatalf("loaded set = %q, want %q", v, want)
	}
	if ttl := e.ttl(t, key); ttl < 5390 || ttl > 5400 {
		t.Errorf("ttl = %d, want the rule's 5400", ttl)
	}
	if s := w.Stats(); s.Loads != 1 || s.Commands != 3 {
		t.Errorf("stats = %+v, want 1 load and 3 calls (append, gets, add)", s)
	}
	// Once present, the set is appended to.
	wantOutcome(t, applyOne(t, w, setRemoveOp(rule, key, "7")), OutcomeAppended)
	if v, _ := e.value(t, key); v != want+"-7 " {
		t.Fatalf("set = %q", v)
	}
}

func TestWriterSetLoadEmpty(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	w := e.writer(&sqlLoader{db: db}, Config{})
	key := e.key("interests:44")
	op := setRemoveOp(rule, key, "3")
	op.Args = []rules.Value{{Kind: rules.KindInt, Text: "44"}}
	wantOutcome(t, applyOne(t, w, op), OutcomeLoaded)
	if v, ok := e.value(t, key); !ok || v != "" {
		t.Fatalf("empty set = %q, %v; want a present empty item", v, ok)
	}
}

// TestWriterSetLoadLosesAddRace: another client creates the set while it
// is loaded; the writer's add fails and its tokens are appended to that
// set instead.
func TestWriterSetLoadLosesAddRace(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	key := e.key("interests:42")
	loader := &sqlLoader{db: db, before: func(context.Context) { e.set(t, key, "+7 +old ", 0) }}
	w := e.writer(loader, Config{})
	op := setAppendOp(rule, key, "-old +new ")
	op.Args = user42
	wantOutcome(t, applyOne(t, w, op), OutcomeAppended)
	if v, _ := e.value(t, key); v != "+7 +old -old +new " {
		t.Fatalf("set = %q, want the other client's set with the tokens appended", v)
	}
}

func TestWriterSetLoadFails(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	down, err := sql.Open("mysql", "root@tcp("+closedPort(t)+")/none?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	badQuery := &rules.Rule{Name: "bad", Query: "SELECT interest FROM no_such_table WHERE user_id = ?"}

	for _, tc := range []struct {
		name      string
		db        *sql.DB
		rule      *rules.Rule
		retryable bool
	}{
		{"mysql down", down, rule, true},
		{"bad query", db, badQuery, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := e.key("interests:fail:" + rules.Escape(tc.name))
			var loadErr error
			inner := &sqlLoader{db: tc.db, before: func(context.Context) {
				// A reader creates the set meanwhile; after a failed
				// load the writer must not leave it in place.
				e.set(t, key, "+stale ", 0)
			}}
			loader := loaderFunc(func(ctx context.Context, q string, args []rules.Value) ([]string, error) {
				m, err := inner.LoadMembers(ctx, q, args)
				loadErr = err
				return m, err
			})
			w := e.writer(loader, Config{})
			op := setAddOp(tc.rule, key, "7")
			op.Args = user42
			wantOutcome(t, applyOne(t, w, op), OutcomeDeleted)
			if _, ok := e.value(t, key); ok {
				t.Fatal("set left in place after a failed load")
			}
			if loadErr == nil || Retryable(loadErr) != tc.retryable {
				t.Errorf("load error %v: Retryable = %v, want %v", loadErr, Retryable(loadErr), tc.retryable)
			}
			if s := w.Stats(); s.LoadErrors != 1 || s.Deletes != 1 {
				t.Errorf("stats = %+v", s)
			}
		})
	}
}

// TestWriterSetLoadCanceled: a load interrupted because the caller gives
// up fails the op (it will be applied again) instead of deleting.
func TestWriterSetLoadCanceled(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := e.writer(&sqlLoader{db: db, before: func(context.Context) { cancel() }}, Config{})
	key := e.key("interests:42")
	op := setAddOp(rule, key, "7")
	op.Args = user42
	results := make([]Result, 1)
	err := w.Apply(ctx, []rules.Op{op}, results)
	if err == nil || !errors.Is(err, context.Canceled) || Retryable(err) {
		t.Fatalf("Apply = %v, want a non-retryable context.Canceled", err)
	}
	wantOutcome(t, results[0], OutcomeFailed)
	if w.Stats().Deletes != 0 {
		t.Error("canceled load deleted the set")
	}
}

// bigSet returns a set value of about size bytes: members "keep" and
// "keep2", then filler tokens; dirty filler is added and removed again.
func bigSet(size int, dirty bool) string {
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

// TestWriterSetTooLargeCompacts: an append that would push a dirty set
// past memcached's item size is refused; the writer compacts the set and
// appends again.
func TestWriterSetTooLargeCompacts(t *testing.T) {
	e := newWTEnv(t)
	max := e.itemSizeMax(t)
	w := e.writer(nil, Config{})
	key := e.key("set:big:dirty")
	e.set(t, key, bigSet(max-8192, true), 0)
	tokens := strings.Repeat("+more -more ", 1500) + "+added "
	wantOutcome(t, applyOne(t, w, setAppendOp(wtSetRule, key, tokens)), OutcomeCompacted)
	v, _ := e.value(t, key)
	if v != "+keep +keep2 "+tokens {
		t.Fatalf("set after compaction is %d bytes, starts %q", len(v), v[:min(len(v), 60)])
	}
	if s := w.Stats(); s.Compactions != 1 || s.Commands != 4 {
		t.Errorf("stats = %+v, want 1 compaction in 4 calls (append, gets, cas, append)", s)
	}
}

// TestWriterSetTooLargeDeletes: a clean set that cannot grow is deleted.
func TestWriterSetTooLargeDeletes(t *testing.T) {
	e := newWTEnv(t)
	max := e.itemSizeMax(t)
	w := e.writer(nil, Config{})
	key := e.key("set:big:clean")
	e.set(t, key, bigSet(max-8192, false), 0)
	tokens := strings.Repeat("+more ", 3000)
	wantOutcome(t, applyOne(t, w, setAppendOp(wtSetRule, key, tokens)), OutcomeDeleted)
	if _, ok := e.value(t, key); ok {
		t.Fatal("a set that cannot take the change was kept")
	}
	if s := w.Stats(); s.Compactions != 0 || s.Deletes != 1 {
		t.Errorf("stats = %+v", s)
	}
}

// TestWriterSetTokensTooLarge: tokens larger than an item are refused with
// SERVER_ERROR; the set is deleted, and a missing one stays missing.
func TestWriterSetTokensTooLarge(t *testing.T) {
	e := newWTEnv(t)
	max := e.itemSizeMax(t)
	w := e.writer(nil, Config{})
	tokens := strings.Repeat("+0123456789 ", max/12+10)

	key := e.key("set:small")
	e.set(t, key, "+a -a +b ", 0)
	wantOutcome(t, applyOne(t, w, setAppendOp(wtSetRule, key, tokens)), OutcomeDeleted)
	if _, ok := e.value(t, key); ok {
		t.Fatal("set kept without the change")
	}

	missing := e.key("set:none")
	wantOutcome(t, applyOne(t, w, setAppendOp(wtSetRule, missing, tokens)), OutcomeMissing)
	if _, ok := e.value(t, missing); ok {
		t.Fatal("missing set created")
	}
}

func TestWriterSampledCompaction(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{CompactSample: 1, CompactRatio: 0.5})
	dirty, atRatio := e.key("set:dirty"), e.key("set:at-ratio")
	e.set(t, dirty, "+a -a +b -b +c ", 0)
	e.set(t, atRatio, "+a +b -a ", 0)
	results, err := apply(t, w, setAddOp(wtSetRule, dirty, "d"), setAddOp(wtSetRule, atRatio, "e"))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, results[0], OutcomeCompacted)
	if v, _ := e.value(t, dirty); v != "+c +d " {
		t.Errorf("dirty set = %q, want compacted", v)
	}
	if ttl := e.ttl(t, dirty); ttl < 7190 || ttl > 7200 {
		t.Errorf("compacted set ttl = %d, want the rule's 7200", ttl)
	}
	// "+a +b -a +e ": 2 of 4 tokens droppable, exactly the ratio.
	wantOutcome(t, results[1], OutcomeCompacted)
	if v, _ := e.value(t, atRatio); v != "+b +e " {
		t.Errorf("set = %q", v)
	}

	below := e.key("set:below")
	e.set(t, below, "+a +b +c -a ", 0)
	wantOutcome(t, applyOne(t, w, setAddOp(wtSetRule, below, "d")), OutcomeAppended) // 2 of 5
	if v, _ := e.value(t, below); v != "+a +b +c -a +d " {
		t.Errorf("set below the ratio = %q, want untouched", v)
	}
}

// TestWriterCompactionLosesCAS: a set appended to between the gets and the
// cas of a compaction keeps the newer append.
func TestWriterCompactionLosesCAS(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("set:cas")
	e.set(t, key, "+a -a +b ", 0)
	it, err := w.gets(key)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, applyOne(t, w, setAddOp(wtSetRule, key, "c")), OutcomeAppended)
	op := setAddOp(wtSetRule, key, "c")
	compacted, err := w.compactItem(&op, it, 0.5)
	if err != nil || compacted {
		t.Fatalf("compactItem = %v, %v; want a lost cas", compacted, err)
	}
	if v, _ := e.value(t, key); v != "+a -a +b +c " {
		t.Fatalf("set = %q: the newer append was overwritten", v)
	}
	if w.Stats().CASConflicts != 1 {
		t.Errorf("stats = %+v", w.Stats())
	}
	// A set deleted between gets and cas stays deleted.
	it, err = w.gets(key)
	if err != nil {
		t.Fatal(err)
	}
	e.mc.Delete(key)
	if compacted, err := w.compactItem(&op, it, 0.5); err != nil || compacted {
		t.Fatalf("compactItem on a deleted set = %v, %v", compacted, err)
	}
	if _, ok := e.value(t, key); ok {
		t.Fatal("compaction recreated a deleted set")
	}
}

// TestWriterCompactionRace appends distinct members (and removes half of
// them) from several goroutines while another compacts the set in a loop;
// no token may be lost.
func TestWriterCompactionRace(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	key := e.key("set:race")
	e.set(t, key, "", 0)
	const goroutines, members = 4, 150
	halfway := make(chan struct{}) // closed after the first compaction
	var halfwayOnce sync.Once
	stop := make(chan struct{})
	compactorDone := make(chan struct{})
	go func() {
		defer close(compactorDone)
		defer halfwayOnce.Do(func() { close(halfway) })
		op := setAddOp(wtSetRule, key, "x")
		for {
			select {
			case <-stop:
				return
			default:
			}
			it, err := w.gets(key)
			if err != nil {
				t.Errorf("gets: %v", err)
				return
			}
			compacted, err := w.compactItem(&op, it, 0.01)
			if err != nil {
				t.Errorf("compact: %v", err)
				return
			}
			if compacted {
				halfwayOnce.Do(func() { close(halfway) })
			}
		}
	}()
	var wg sync.WaitGroup
	want := map[string]bool{}
	for g := range goroutines {
		for i := range members {
			want[fmt.Sprintf("g%d m%d", g, i)] = i%2 == 0
		}
		wg.Go(func() {
			for i := range members {
				if i == members/2 {
					<-halfway // the second half races with compactions under way
				}
				m := fmt.Sprintf("g%d m%d", g, i)
				if r := applyResult(w, setAddOp(wtSetRule, key, m)); r.Err != nil {
					t.Errorf("add %s: %v", m, r.Err)
				}
				if i%2 == 1 {
					if r := applyResult(w, setRemoveOp(wtSetRule, key, m)); r.Err != nil {
						t.Errorf("remove %s: %v", m, r.Err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-compactorDone
	v, _ := e.value(t, key)
	st := itemformat.DecodeSet([]byte(v))
	var got, expected []string
	for _, m := range st.Members {
		got = append(got, itemformat.Unescape(m))
	}
	for m, present := range want {
		if present {
			expected = append(expected, m)
		}
	}
	slices.Sort(got)
	slices.Sort(expected)
	if !slices.Equal(got, expected) {
		t.Fatalf("members after the race: %d, want %d\ngot  %q\nwant %q", len(got), len(expected), got, expected)
	}
	s := w.Stats()
	t.Logf("%d compactions, %d lost cas, final set %d tokens", s.Compactions, s.CASConflicts, st.Tokens)
}

// TestWriterSameKeyInOrder: ops of one key in one Apply keep their order
// even though keys run concurrently.
func TestWriterSameKeyInOrder(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{MaxConcurrency: 8})
	const keys = 40
	var ops []rules.Op
	for round := range 3 {
		for k := range keys {
			key := e.key("order:" + strconv.Itoa(k))
			if round == 0 {
				e.set(t, key, "", 0)
			}
			switch round {
			case 0:
				ops = append(ops, setAddOp(wtSetRule, key, "m"))
			case 1:
				ops = append(ops, setRemoveOp(wtSetRule, key, "m"))
			case 2:
				ops = append(ops, setAddOp(wtSetRule, key, "n"))
			}
		}
	}
	if _, err := apply(t, w, ops...); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		key := e.key("order:" + strconv.Itoa(k))
		if v, _ := e.value(t, key); v != "+m -m +n " {
			t.Fatalf("%s = %q, want the ops in order", key, v)
		}
	}
}

func TestWriterRejectsInvalidOps(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	canary := e.key("canary")
	e.set(t, canary, "alive", 0)
	good := e.key("good")
	tests := []struct {
		name string
		op   rules.Op
		want error
	}{
		{"space in key", bumpOp(e.key("a b")), ErrInvalidKey},
		{"protocol injection", bumpOp(e.key("x 1\r\nflush_all\r\nincr y")), ErrInvalidKey},
		{"delete injection", setAddOp(wtSetRule, "k\r\ndelete "+canary, "m"), ErrInvalidKey},
		{"del byte", bumpOp(e.key("a\x7f")), ErrInvalidKey},
		{"empty key", bumpOp(""), ErrInvalidKey},
		{"251 bytes", bumpOp(e.key(strings.Repeat("k", 251-len(e.prefix)))), ErrInvalidKey},
		{"no rule", rules.Op{Kind: rules.OpBump, Key: good}, ErrInvalidOp},
		{"zero kind", rules.Op{Rule: wtBumpRule, Key: good}, ErrInvalidOp},
		{"unescaped member", rules.Op{Kind: rules.OpSetAdd, Rule: wtSetRule, Key: good, Member: "a b"}, ErrInvalidOp},
		{"empty tokens", setAppendOp(wtSetRule, good, ""), ErrInvalidOp},
		{"no trailing space", setAppendOp(wtSetRule, good, "+a"), ErrInvalidOp},
		{"no op byte", setAppendOp(wtSetRule, good, "+a b "), ErrInvalidOp},
		{"double space", setAppendOp(wtSetRule, good, "+a  +b "), ErrInvalidOp},
		{"newline in tokens", setAppendOp(wtSetRule, good, "+a\n+b "), ErrInvalidOp},
	}
	ops := make([]rules.Op, len(tests))
	for i, tc := range tests {
		ops[i] = tc.op
	}
	results, err := apply(t, w, ops...)
	var applyErr *ApplyError
	if !errors.As(err, &applyErr) || len(applyErr.Errs) != len(tests) || Retryable(err) {
		t.Fatalf("Apply = %v, want a non-retryable ApplyError with %d errors", err, len(tests))
	}
	for i, tc := range tests {
		if r := results[i]; r.Outcome != OutcomeFailed || !errors.Is(r.Err, tc.want) || Retryable(r.Err) {
			t.Errorf("%s: %v (%v), want failed with %v", tc.name, r.Outcome, r.Err, tc.want)
		}
	}
	if calls := w.Stats().Commands; calls != 0 {
		t.Errorf("%d memcached calls made for invalid ops", calls)
	}
	if v, _ := e.value(t, canary); v != "alive" {
		t.Fatal("canary item changed")
	}
	// The longest legal key works.
	long := e.key(strings.Repeat("k", 250-len(e.prefix)))
	wantOutcome(t, applyOne(t, w, bumpOp(long)), OutcomeAdded)
}

func TestWriterMemcachedDown(t *testing.T) {
	mc := memcache.New(closedPort(t))
	w := NewTextApplier(mc, nil, nil, Config{}, nil)
	ops := []rules.Op{bumpOp("ns:1"), setAddOp(wtSetRule, "set:1", "m")}
	results := make([]Result, len(ops))
	err := w.Apply(context.Background(), ops, results)
	if err == nil || !Retryable(err) {
		t.Fatalf("Apply = %v, want a retryable error", err)
	}
	for i, r := range results {
		if r.Outcome != OutcomeFailed || !Retryable(r.Err) {
			t.Errorf("op %d: %v (%v)", i, r.Outcome, r.Err)
		}
	}
	if !strings.Contains(results[0].Err.Error(), `cacheops: incr "ns:1"`) || !strings.Contains(results[1].Err.Error(), `cacheops: append "set:1"`) {
		t.Errorf("errors lack context: %v; %v", results[0].Err, results[1].Err)
	}
}

func TestWriterApplyCanceled(t *testing.T) {
	e := newWTEnv(t)
	w := e.writer(nil, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := e.key("ns:canceled")
	results := make([]Result, 1)
	err := w.Apply(ctx, []rules.Op{bumpOp(key)}, results)
	if !errors.Is(err, context.Canceled) || results[0].Outcome != OutcomeFailed {
		t.Fatalf("Apply = %v, %+v", err, results[0])
	}
	if _, ok := e.value(t, key); ok || w.Stats().Commands != 0 {
		t.Fatal("canceled Apply sent requests")
	}
}

func TestWriterApplyShortResults(t *testing.T) {
	w := NewTextApplier(memcache.New(closedPort(t)), nil, nil, Config{}, nil)
	err := w.Apply(context.Background(), []rules.Op{bumpOp("a"), bumpOp("b")}, make([]Result, 1))
	if !errors.Is(err, ErrInvalidOp) || w.Stats().Commands != 0 {
		t.Fatalf("Apply = %v", err)
	}
	if err := w.Apply(context.Background(), nil, nil); err != nil {
		t.Fatalf("empty Apply = %v", err)
	}
}

func TestWriterExpiration(t *testing.T) {
	w := NewTextApplier(memcache.New(), nil, nil, Config{Now: func() time.Time { return wtClock }}, nil)
	now := wtClock.Unix()
	tests := []struct {
		ttl  time.Duration
		want int32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Millisecond, 1},
		{1500 * time.Millisecond, 2},
		{time.Hour, 3600},
		{30 * 24 * time.Hour, 2592000},
		{30*24*time.Hour + time.Second, int32(now + 2592001)},
		{365 * 24 * time.Hour, int32(now + 365*24*3600)},
		{200 * 365 * 24 * time.Hour, 1<<31 - 1},
	}
	for _, tc := range tests {
		if got := w.expiration(tc.ttl); got != tc.want {
			t.Errorf("expiration(%v) = %d, want %d", tc.ttl, got, tc.want)
		}
	}
}

func TestOutcomeString(t *testing.T) {
	want := map[Outcome]string{
		OutcomeFailed: "failed", OutcomeIncr: "incr", OutcomeAdded: "added", OutcomeAppended: "appended",
		OutcomeCompacted: "compacted", OutcomeLoaded: "loaded", OutcomeMissing: "missing", OutcomeDeleted: "deleted",
		Outcome(99): "outcome(99)",
	}
	for o, s := range want {
		if o.String() != s {
			t.Errorf("Outcome(%d).String() = %q, want %q", o, o.String(), s)
		}
	}
}

func TestApplyErrorMessage(t *testing.T) {
	var errs []error
	for i := range 5 {
		errs = append(errs, fmt.Errorf("op %d failed", i))
	}
	err := &ApplyError{Ops: 10, Errs: errs}
	want := "cacheops: 5 of 10 ops failed: op 0 failed; op 1 failed; op 2 failed; and 2 more"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if !errors.Is(err, errs[4]) {
		t.Error("ApplyError does not unwrap to every error")
	}
}

// Guard against the test helpers' own mistakes: a set written by bigSet
// must decode to the two kept members (plus clean filler).
func TestBigSetHelper(t *testing.T) {
	st := itemformat.DecodeSet([]byte(bigSet(10000, true)))
	if !slices.Equal(st.Members, []string{"keep", "keep2"}) || !bytes.HasPrefix([]byte(bigSet(100, false)), []byte("+keep +keep2 +filler")) {
		t.Fatalf("bigSet: %+v", st.Members)
	}
}

// TestWriterSetRebuild: replay's rebuild replaces a wrong set by the full
// set its load query returns, with the rule's TTL; a set whose rule has no
// load query is deleted; a set created by someone else between the
// rebuild's delete and its add is kept.
func TestWriterSetRebuild(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	w := e.writer(&sqlLoader{db: db}, Config{})
	key := e.key("interests:42")
	e.set(t, key, "+7 +resurrected -100%25 ", 0)
	op := rules.Op{Kind: rules.OpSetRebuild, Rule: rule, Key: key, Args: user42}
	wantOutcome(t, applyOne(t, w, op), OutcomeLoaded)
	if v, _ := e.value(t, key); v != "+100%25 +7 +caf\u00e9 +rock%20climbing " {
		t.Fatalf("rebuilt set = %q, want MySQL's members", v)
	}
	if ttl := e.ttl(t, key); ttl < 5390 || ttl > 5400 {
		t.Errorf("ttl = %d, want the rule's 5400", ttl)
	}

	noLoad := &rules.Rule{Name: "no-load"}
	other := e.key("interests:43")
	e.set(t, other, "+9 +resurrected ", 0)
	wantOutcome(t, applyOne(t, w, rules.Op{Kind: rules.OpSetDelete, Rule: noLoad, Key: other}), OutcomeDeleted)
	if v, ok := e.value(t, other); ok {
		t.Fatalf("set_delete left %q", v)
	}
	e.set(t, other, "+9 +resurrected ", 0)
	wantOutcome(t, applyOne(t, w, rules.Op{Kind: rules.OpSetRebuild, Rule: noLoad, Key: other}), OutcomeDeleted)
	if v, ok := e.value(t, other); ok {
		t.Fatalf("a rebuild without a load query left %q", v)
	}

	// A daemon loads the set between the rebuild's delete and its add.
	e.set(t, key, "+resurrected ", 0)
	racing := &sqlLoader{db: db, before: func(context.Context) { e.set(t, key, "+7 +daemon ", 0) }}
	wantOutcome(t, applyOne(t, e.writer(racing, Config{}), op), OutcomeLoaded)
	if v, _ := e.value(t, key); v != "+7 +daemon " {
		t.Fatalf("set = %q, want the set created after the delete", v)
	}
}

// TestWriterSetLoadUnderGeneration: a set the writer loads carries the
// generation of its table read before the load query (docs/formats.md,
// "Generations"); a missing generation is created first; a generation
// bumped during the load leaves the loaded set stale.
func TestWriterSetLoadUnderGeneration(t *testing.T) {
	e := newWTEnv(t)
	db, rule := interestsDB(t)
	rule.Generation = e.key("%gen:user_interests")
	const members = "+100%25 +7 +caf\u00e9 +rock%20climbing "
	genOf := func() uint64 {
		v, ok := e.value(t, rule.Generation)
		g, parsed := itemformat.ParseGeneration([]byte(v))
		if !ok || !parsed {
			t.Fatalf("generation item %q, %v", v, ok)
		}
		return g
	}

	// Missing: created, then the set is loaded under it.
	var bump func(context.Context)
	w := e.writer(&sqlLoader{db: db, before: func(ctx context.Context) {
		if bump != nil {
			bump(ctx)
		}
	}}, Config{})
	key := e.key("interests:42")
	op := setAppendOp(rule, key, "+7 ")
	op.Args = user42
	wantOutcome(t, applyOne(t, w, op), OutcomeLoaded)
	g := genOf()
	if v, _ := e.value(t, key); v != "g"+strconv.FormatUint(g, 10)+" "+members {
		t.Fatalf("loaded set = %q, want it under generation %d", v, g)
	}

	// A loss during the load: the set is stamped with the generation
	// read before it, which readers then reject.
	bump = func(context.Context) {
		if _, err := e.mc.Increment(rule.Generation, 1); err != nil {
			t.Error(err)
		}
	}
	key = e.key("interests:43")
	op = setAppendOp(rule, key, "+9 ")
	op.Args = []rules.Value{{Kind: rules.KindInt, Text: "43"}}
	wantOutcome(t, applyOne(t, w, op), OutcomeLoaded)
	v, _ := e.value(t, key)
	if st := itemformat.DecodeSet([]byte(v)); !st.HasGen || st.Gen != g || st.ValidAt(genOf()) {
		t.Fatalf("set loaded across a bump = %q: want generation %d, now stale (generation %d)", v, g, genOf())
	}
}
