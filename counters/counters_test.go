package counters

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// env is one test's services: memcached with a private key prefix, and a
// fresh MySQL database with a comments table.
type env struct {
	t      testing.TB
	addr   string
	mc     *memcache.Client
	prefix string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	mc.MaxIdleConns = 64
	mc.Timeout = 2 * time.Second
	t.Cleanup(func() { mc.Close() })
	return &env{t: t, addr: addr, mc: mc, prefix: "cwtest:counters:" + testsvc.Unique() + ":"}
}

func (e *env) key(name string) string { return e.prefix + name }

func (e *env) set(key, value string) {
	e.t.Helper()
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte(value)}); err != nil {
		e.t.Fatal(err)
	}
}

// value returns the item's value with decr's space padding trimmed, or
// "<missing>".
func (e *env) value(key string) string {
	e.t.Helper()
	it, err := e.mc.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return "<missing>"
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimRight(string(it.Value), " ")
}

// ttl returns the remaining TTL memcached reports for key (-1: none), with
// the meta get command.
func (e *env) ttl(key string) int {
	e.t.Helper()
	conn, err := net.DialTimeout("tcp", e.addr, 2*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "mg %s t\r\n", key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		e.t.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "HD" || !strings.HasPrefix(f[1], "t") {
		e.t.Fatalf("mg %s t: %q", key, line)
	}
	n, err := strconv.Atoi(f[1][1:])
	if err != nil {
		e.t.Fatalf("mg %s t: %q", key, line)
	}
	return n
}

var countRule = &rules.Rule{
	Name:  "post-comments",
	Kind:  rules.CountRule,
	TTL:   time.Hour,
	Query: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1",
}

var noRecountRule = &rules.Rule{Name: "post-likes", Kind: rules.CountRule}

func countOp(key string, delta int64, postID string) rules.Op {
	return rules.Op{Kind: rules.OpCount, Rule: countRule, Key: key, Delta: delta, Args: []rules.Value{intValue(postID)}}
}

func recountOp(key, postID string) rules.Op {
	return rules.Op{Kind: rules.OpRecount, Rule: countRule, Key: key, Args: []rules.Value{intValue(postID)}}
}

// apply runs Apply and returns the outcomes; it fails the test when Apply
// fails.
func apply(t testing.TB, c *Counters, ops ...rules.Op) []cacheops.Outcome {
	t.Helper()
	results := make([]cacheops.Result, len(ops))
	if err := c.Apply(context.Background(), ops, results); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	out := make([]cacheops.Outcome, len(ops))
	for i, r := range results {
		if r.Err != nil {
			t.Fatalf("op %d failed without Apply failing: %v", i, r.Err)
		}
		out[i] = r.Outcome
	}
	return out
}

func wantOutcomes(t testing.TB, got []cacheops.Outcome, want ...cacheops.Outcome) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outcomes = %v, want %v", got, want)
	}
}

func TestApplyHit(t *testing.T) {
	e := newEnv(t)
	c := New(e.mc, nil, Config{}, nil)
	up, down := e.key("up"), e.key("down")
	e.set(up, "10")
	e.set(down, "10")
	got := apply(t, c, countOp(up, 3, "1"), countOp(down, -4, "1"))
	wantOutcomes(t, got, cacheops.OutcomeIncr, cacheops.OutcomeDecr)
	if v := e.value(up); v != "13" {
		t.Errorf("after +3: %s, want 13", v)
	}
	if v := e.value(down); v != "6" {
		t.Errorf("after -4: %s, want 6", v)
	}
	if s := c.Stats(); s.Calls != 2 || s.Recounts != 0 {
		t.Errorf("stats = %+v, want 2 calls and no recount", s)
	}
}

func TestApplyMissRecountAdd(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)
	// The change (a third comment) is committed before its event arrives.
	addComments(t, db, 9, "ann", 3)
	k := e.key("comments:9")
	wantOutcomes(t, apply(t, c, countOp(k, 1, "9")), cacheops.OutcomeLoaded)
	if v := e.value(k); v != "3" {
		t.Fatalf("counter = %s, want 3 (the recount, change included)", v)
	}
	if ttl := e.ttl(k); ttl < 3500 || ttl > 3600 {
		t.Fatalf("TTL = %d, want the rule's hour", ttl)
	}
	// Now present: the next delta is a plain incr.
	wantOutcomes(t, apply(t, c, countOp(k, 2, "9")), cacheops.OutcomeIncr)
	if v := e.value(k); v != "5" {
		t.Fatalf("counter = %s, want 5", v)
	}
}

func TestApplyMissWithoutRecount(t *testing.T) {
	m, _, _ := newCommentsDB(t)
	e := newEnv(t)
	k := e.key("likes:1")
	c := New(e.mc, m, Config{}, nil)
	op := rules.Op{Kind: rules.OpCount, Rule: noRecountRule, Key: k, Delta: 1}
	wantOutcomes(t, apply(t, c, op), cacheops.OutcomeMissing)
	// A count rule with a query, but no Recounter.
	bare := New(e.mc, nil, Config{}, nil)
	wantOutcomes(t, apply(t, bare, countOp(k, -1, "1")), cacheops.OutcomeMissing)
	if v := e.value(k); v != "<missing>" {
		t.Fatalf("counter = %s, want it still missing", v)
	}
}

// racingRecounter stores a value under key while the recount runs, as
// another writer or a reader would between the miss and the add.
type racingRecounter struct {
	Recounter
	mc    *memcache.Client
	key   string
	value string
}

func (r *racingRecounter) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	if err := r.mc.Set(&memcache.Item{Key: r.key, Value: []byte(r.value)}); err != nil {
		return 0, err
	}
	return r.Recounter.Count(ctx, query, args)
}

func TestApplyLostAddRaceReappliesDelta(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, 4, "ann", 7)
	e := newEnv(t)
	for _, tc := range []struct {
		delta   int64
		want    string
		outcome cacheops.Outcome
	}{
		{+2, "102", cacheops.OutcomeIncr},
		{-3, "97", cacheops.OutcomeDecr},
	} {
		k := e.key("race:" + strconv.FormatInt(tc.delta, 10))
		c := New(e.mc, &racingRecounter{Recounter: m, mc: e.mc, key: k, value: "100"}, Config{}, nil)
		wantOutcomes(t, apply(t, c, countOp(k, tc.delta, "4")), tc.outcome)
		if v := e.value(k); v != tc.want {
			t.Errorf("delta %d after a lost add: counter = %s, want %s (the other value plus the delta, not the recount 7)", tc.delta, v, tc.want)
		}
		if s := c.Stats(); s.Recounts != 1 {
			t.Errorf("recounts = %d, want 1", s.Recounts)
		}
	}
}

func TestApplyDecrAtZeroRecounts(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, 5, "ann", 5)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)

	// Drift: the counter says 1, three rows went away, MySQL has 5.
	drift := e.key("drift")
	e.set(drift, "1")
	wantOutcomes(t, apply(t, c, countOp(drift, -3, "5")), cacheops.OutcomeRecounted)
	if v := e.value(drift); v != "5" {
		t.Fatalf("after drift: %s, want the recount 5", v)
	}
	if ttl := e.ttl(drift); ttl < 3500 || ttl > 3600 {
		t.Fatalf("TTL after the recount's set = %d, want the rule's hour", ttl)
	}

	// Exactly zero is legitimate, and the recount confirms it.
	exact := e.key("exact")
	e.set(exact, "2")
	wantOutcomes(t, apply(t, c, countOp(exact, -2, "6")), cacheops.OutcomeRecounted)
	if v := e.value(exact); v != "0" {
		t.Fatalf("after reaching zero: %s, want 0", v)
	}

	// Above zero: no recount.
	before := c.Stats().Recounts
	above := e.key("above")
	e.set(above, "3")
	wantOutcomes(t, apply(t, c, countOp(above, -2, "5")), cacheops.OutcomeDecr)
	if v := e.value(above); v != "1" || c.Stats().Recounts != before {
		t.Fatalf("after -2 from 3: %s with %d new recounts, want 1 and none", v, c.Stats().Recounts-before)
	}
	if d := c.Stats().Drifts; d != 2 {
		t.Fatalf("drifts = %d, want 2", d)
	}

	// Without a recount query a clamped counter cannot be checked: delete.
	bare := e.key("bare")
	e.set(bare, "1")
	op := rules.Op{Kind: rules.OpCount, Rule: noRecountRule, Key: bare, Delta: -3}
	wantOutcomes(t, apply(t, c, op), cacheops.OutcomeDeleted)
	if v := e.value(bare); v != "<missing>" {
		t.Fatalf("unverifiable clamped counter = %s, want missing", v)
	}
}

func TestApplyNonNumericRecounts(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, 5, "ann", 2)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)
	k := e.key("garbage")
	e.set(k, "not a number")
	wantOutcomes(t, apply(t, c, countOp(k, 1, "5")), cacheops.OutcomeRecounted)
	if v := e.value(k); v != "2" {
		t.Fatalf("counter = %s, want 2", v)
	}
}

func TestApplyRecountOp(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, 3, "ann", 3)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)
	wrong, missing := e.key("wrong"), e.key("missing")
	e.set(wrong, "999")
	got := apply(t, c, recountOp(wrong, "3"), recountOp(missing, "3"))
	wantOutcomes(t, got, cacheops.OutcomeRecounted, cacheops.OutcomeRecounted)
	if v := e.value(wrong); v != "3" {
		t.Fatalf("recounted counter = %s, want 3", v)
	}
	if v := e.value(missing); v != "3" {
		t.Fatalf("recounted missing counter = %s, want 3", v)
	}
}

// closedPortMySQL returns a MySQL whose server does not exist.
func closedPortMySQL(t *testing.T) *MySQL {
	t.Helper()
	m, err := OpenMySQL("root@tcp(127.0.0.1:1)/shop", DBConfig{QueryTimeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestApplyMySQLUnreachableDeletes(t *testing.T) {
	e := newEnv(t)
	c := New(e.mc, closedPortMySQL(t), Config{}, nil)
	recount, drift, miss := e.key("recount"), e.key("drift"), e.key("miss")
	e.set(recount, "999")
	e.set(drift, "1")
	got := apply(t, c, recountOp(recount, "1"), countOp(drift, -2, "1"), countOp(miss, 1, "1"))
	wantOutcomes(t, got, cacheops.OutcomeDeleted, cacheops.OutcomeDeleted, cacheops.OutcomeDeleted)
	for _, k := range []string{recount, drift, miss} {
		if v := e.value(k); v != "<missing>" {
			t.Errorf("%s = %s, want missing", k, v)
		}
	}
	if s := c.Stats(); s.RecountErrors != 3 || s.Deletes != 3 {
		t.Errorf("stats = %+v, want 3 recount errors and 3 deletes", s)
	}
}

func TestApplyMemcachedDownIsRetryable(t *testing.T) {
	down := memcache.New("127.0.0.1:1")
	down.Timeout = time.Second
	for _, tc := range []struct {
		name string
		rc   Recounter
		op   rules.Op
	}{
		{"incr", nil, countOp("k", 1, "1")},
		{"decr", nil, countOp("k", -1, "1")},
		// MySQL is down too, and the delete that must follow fails.
		{"recount then delete", closedPortMySQL(t), recountOp("k", "1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(down, tc.rc, Config{}, nil)
			results := make([]cacheops.Result, 1)
			err := c.Apply(context.Background(), []rules.Op{tc.op}, results)
			if err == nil || results[0].Err == nil || results[0].Outcome != cacheops.OutcomeFailed {
				t.Fatalf("Apply = %v, result %+v; want a failure", err, results[0])
			}
			if !cacheops.Retryable(err) {
				t.Fatalf("error %v is not retryable", err)
			}
		})
	}
}

func TestApplyBindsHostileArgument(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	hostile := `o'brien "q" \'; DROP TABLE comments; --`
	addComments(t, db, 1, hostile, 3)
	addComments(t, db, 1, "o", 2)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)
	rule := &rules.Rule{Name: "by-author", Kind: rules.CountRule, Query: "SELECT COUNT(*) FROM comments WHERE author = ?"}
	k := e.key("author")
	op := rules.Op{Kind: rules.OpRecount, Rule: rule, Key: k, Args: []rules.Value{stringValue(hostile)}}
	wantOutcomes(t, apply(t, c, op), cacheops.OutcomeRecounted)
	if v := e.value(k); v != "3" {
		t.Fatalf("counter = %s, want 3", v)
	}
	var total int
	if err := db.QueryRow("SELECT COUNT(*) FROM comments").Scan(&total); err != nil || total != 5 {
		t.Fatalf("comments table: %d rows, %v; want it intact with 5", total, err)
	}
}

func TestApplyBigUnsignedIDs(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, uint64(math.MaxUint64), "ann", 4)
	addComments(t, db, uint64(math.MaxUint64-1), "ann", 1)
	addComments(t, db, uint64(1<<63), "ann", 2)
	e := newEnv(t)
	c := New(e.mc, m, Config{}, nil)
	k1, k2 := e.key("max"), e.key("2^63")
	got := apply(t, c, countOp(k1, 1, "18446744073709551615"), countOp(k2, 1, "9223372036854775808"))
	wantOutcomes(t, got, cacheops.OutcomeLoaded, cacheops.OutcomeLoaded)
	if v := e.value(k1); v != "4" {
		t.Errorf("counter of 2^64-1 = %s, want 4", v)
	}
	if v := e.value(k2); v != "2" {
		t.Errorf("counter of 2^63 = %s, want 2", v)
	}
}

func TestApplyConcurrentOnOneKey(t *testing.T) {
	e := newEnv(t)
	c := New(e.mc, nil, Config{}, nil)
	k := e.key("hot")
	e.set(k, "100000")
	const goroutines, rounds = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	want := int64(100000)
	for g := range goroutines {
		delta := int64(g%5) - 1 // -1, 0, 1, 2, 3
		want += delta * rounds
		wg.Go(func() {
			for range rounds {
				results := make([]cacheops.Result, 1)
				if err := c.Apply(context.Background(), []rules.Op{countOp(k, delta, "1")}, results); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v := e.value(k); v != strconv.FormatInt(want, 10) {
		t.Fatalf("counter = %s, want %d", v, want)
	}
}

func TestApplyManyKeysAndBadOps(t *testing.T) {
	e := newEnv(t)
	c := New(e.mc, nil, Config{MaxConcurrency: 4}, nil)
	var ops []rules.Op
	for i := range 20 {
		k := e.key("many:" + strconv.Itoa(i))
		e.set(k, "50")
		ops = append(ops, countOp(k, int64(i+1), "1"))
	}
	// Same key twice: applied in order.
	ops = append(ops, countOp(e.key("many:0"), -10, "1"))
	ops = append(ops, rules.Op{Kind: rules.OpBump, Rule: countRule, Key: e.key("bump")})
	ops = append(ops, rules.Op{Kind: rules.OpCount, Key: e.key("norule"), Delta: 1})
	ops = append(ops, countOp("bad key", 1, "1"))
	results := make([]cacheops.Result, len(ops))
	err := c.Apply(context.Background(), ops, results)
	var ae *cacheops.ApplyError
	if !errors.As(err, &ae) || len(ae.Errs) != 3 || ae.Ops != len(ops) {
		t.Fatalf("Apply = %v, want an ApplyError with 3 of %d ops", err, len(ops))
	}
	if cacheops.Retryable(err) {
		t.Fatalf("invalid ops reported retryable: %v", err)
	}
	for i := range 20 {
		want := strconv.Itoa(50 + i + 1)
		if i == 0 {
			want = "41"
		}
		if v := e.value(e.key("many:" + strconv.Itoa(i))); v != want {
			t.Errorf("many:%d = %s, want %s", i, v, want)
		}
	}
	for _, r := range results[len(ops)-3:] {
		if r.Outcome != cacheops.OutcomeFailed || r.Err == nil {
			t.Errorf("bad op result = %+v, want a failure", r)
		}
	}
	if err := c.Apply(context.Background(), ops, results[:1]); err == nil {
		t.Fatal("Apply with too few results succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Apply(ctx, ops[:1], results); !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply with a cancelled context = %v, want context.Canceled", err)
	}
}

func TestGet(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	addComments(t, db, 9, "ann", 3)
	e := newEnv(t)
	c := New(e.mc, m, Config{ReadTTL: time.Minute}, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	k := e.key("get:9")
	const q = "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = ?"

	n, err := c.Get(ctx, k, q, 9, true)
	if err != nil || n != 3 {
		t.Fatalf("Get on a miss = %d, %v; want the recount 3", n, err)
	}
	if v := e.value(k); v != "3" {
		t.Fatalf("stored counter = %s, want 3", v)
	}
	if ttl := e.ttl(k); ttl < 50 || ttl > 60 {
		t.Fatalf("TTL = %d, want ReadTTL's minute", ttl)
	}
	// A hit comes from memcached, not from MySQL.
	addComments(t, db, 9, "bob", 1)
	if n, err := c.Get(ctx, k, q, 9, true); err != nil || n != 3 {
		t.Fatalf("Get on a hit = %d, %v; want the cached 3", n, err)
	}
	// decr may leave space padding behind the digits.
	e.set(k, "100")
	if _, err := e.mc.Decrement(k, 95); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Get(ctx, k, q, 9, true); err != nil || n != 5 {
		t.Fatalf("Get after decr = %d, %v; want 5", n, err)
	}
	// A non-numeric item is replaced by the recount.
	e.set(k, "junk")
	if n, err := c.Get(ctx, k, q, uint64(9), rules.Value{Kind: rules.KindBool, Text: "1"}); err != nil || n != 4 {
		t.Fatalf("Get over junk = %d, %v; want 4", n, err)
	}
	if v := e.value(k); v != "4" {
		t.Fatalf("stored counter = %s, want 4", v)
	}
	// Unsupported argument types and query errors are errors.
	if _, err := c.Get(ctx, e.key("get:x"), q, struct{}{}, 1); err == nil {
		t.Fatal("Get with a struct argument succeeded")
	}
	if _, err := c.Get(ctx, e.key("get:y"), "SELECT nope FROM comments", nil); err == nil {
		t.Fatal("Get with a bad query succeeded")
	}
	if v := e.value(e.key("get:y")); v != "<missing>" {
		t.Fatalf("failed Get stored %s", v)
	}
	// Without a Recounter a miss is an error, a hit still works.
	bare := New(e.mc, nil, Config{}, nil)
	if n, err := bare.Get(ctx, k, q, 9, 1); err != nil || n != 4 {
		t.Fatalf("Get hit without a recounter = %d, %v; want 4", n, err)
	}
	if _, err := bare.Get(ctx, e.key("get:z"), q, 9, 1); err == nil {
		t.Fatal("Get miss without a recounter succeeded")
	}
	// memcached down: the count comes from MySQL.
	down := memcache.New("127.0.0.1:1")
	if n, err := New(down, m, Config{}, nil).Get(ctx, k, q, 9, 1); err != nil || n != 4 {
		t.Fatalf("Get with memcached down = %d, %v; want 4 from MySQL", n, err)
	}
}

func TestValuesOf(t *testing.T) {
	got, err := valuesOf([]any{nil, "s", []byte("b"), true, false, -5, int8(-8), uint64(math.MaxUint64), uint8(7), 1.5, float32(0.25),
		rules.Value{Kind: rules.KindJSON, Text: "{}"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []rules.Value{
		{Kind: rules.KindNull},
		{Kind: rules.KindString, Text: "s"},
		{Kind: rules.KindString, Text: "b"},
		{Kind: rules.KindBool, Text: "1"},
		{Kind: rules.KindBool, Text: "0"},
		{Kind: rules.KindInt, Text: "-5"},
		{Kind: rules.KindInt, Text: "-8"},
		{Kind: rules.KindInt, Text: "18446744073709551615"},
		{Kind: rules.KindInt, Text: "7"},
		{Kind: rules.KindFloat, Text: "1.5"},
		{Kind: rules.KindFloat, Text: "0.25"},
		{Kind: rules.KindJSON, Text: "{}"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("valuesOf = %+v\nwant %+v", got, want)
	}
	for _, bad := range []any{math.NaN(), math.Inf(1), time.Now(), struct{}{}} {
		if _, err := valuesOf([]any{bad}); err == nil {
			t.Errorf("valuesOf(%T) succeeded", bad)
		}
	}
}

func TestExpiration(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := &Counters{cfg: Config{Now: func() time.Time { return now }}}
	for _, tc := range []struct {
		ttl  time.Duration
		want int32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Millisecond, 1},
		{90 * time.Second, 90},
		{1500 * time.Millisecond, 2},
		{30 * 24 * time.Hour, 30 * 24 * 3600},
		{31 * 24 * time.Hour, int32(now.Unix()) + 31*24*3600},
	} {
		if got := c.expiration(tc.ttl); got != tc.want {
			t.Errorf("expiration(%v) = %d, want %d", tc.ttl, got, tc.want)
		}
	}
}

// BenchmarkApply measures counter ops on hits: batches of 256 keys, each
// an incr or a decr that stays above zero.
func BenchmarkApply(b *testing.B) {
	e := newEnv(b)
	c := New(e.mc, nil, Config{}, nil)
	const batch = 256
	ops := make([]rules.Op, batch)
	for i := range ops {
		k := e.key("bench:" + strconv.Itoa(i))
		e.set(k, "1000000000")
		delta := int64(1)
		if i%2 == 1 {
			delta = -1
		}
		ops[i] = countOp(k, delta, "1")
	}
	results := make([]cacheops.Result, batch)
	ctx := context.Background()
	iterations := 0
	start := time.Now()
	for b.Loop() {
		if err := c.Apply(ctx, ops, results); err != nil {
			b.Fatal(err)
		}
		iterations++
	}
	b.ReportMetric(float64(iterations*batch)/time.Since(start).Seconds(), "ops/s")
}
