package client

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// TestDependencies keeps the client free of the daemon's writers and heavy
// dependencies: an application that imports it links neither Kafka, a
// SQL driver nor a YAML parser.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"kafka", "franz-go", "go-sql-driver", "yaml", "/consumer", "/counters", "/cacheops", "prometheus"} {
			if strings.Contains(dep, banned) {
				t.Errorf("the client depends on %s", dep)
			}
		}
	}
}

// TestKeysAreTheDaemons plans row changes with the rules and checks that
// the client renders the very keys the daemon writes, for escaped, long
// (hashed) and typed values.
func TestKeysAreTheDaemons(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	long := strings.Repeat("é", 150)
	cases := []struct {
		rule, table string
		row         rules.Row
		client      Row
	}{
		{"user", "users", rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: "42"}}}, Row{"id": 42}},
		{"user", "users", rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: "18446744073709551615"}}}, Row{"id": uint64(18446744073709551615)}},
		{"user", "users", rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindString, Text: "a b%c\n"}}}, Row{"id": "a b%c\n"}},
		{"user", "users", rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindString, Text: long}}}, Row{"id": []byte(long)}},
		{"user", "users", rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindBool, Text: "1"}}}, Row{"id": true}},
		{"post-comments", "comments", rules.Row{
			{Name: "post_id", Value: rules.Value{Kind: rules.KindInt, Text: "9"}},
			{Name: "approved", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}}, Row{"post_id": int16(9)}},
	}
	for _, tc := range cases {
		ops, _, err := e.rs.Plan(nil, &rules.Event{Table: tc.table, Operation: rules.Insert, After: tc.row})
		// Not the invalidation of an earlier release's key (rules.Op.Legacy).
		ops = slices.DeleteFunc(ops, func(op rules.Op) bool { return op.Legacy })
		if err != nil || len(ops) != 1 {
			t.Fatalf("plan %v: %v, %v", tc.row, ops, err)
		}
		got, err := e.c.Key(tc.rule, tc.client)
		if err != nil || got != ops[0].Key {
			t.Errorf("Key(%q, %v) = %q, %v; the daemon writes %q", tc.rule, tc.client, got, err, ops[0].Key)
		}
	}
	for _, bad := range []Row{{}, {"id": nil}, {"id": struct{}{}}} {
		if k, err := e.c.Key("user", bad); err == nil {
			t.Errorf("Key(user, %v) = %q, want an error", bad, k)
		}
	}
	if _, err := e.c.Key("nope", Row{}); !errors.Is(err, ErrUnknownRule) {
		t.Errorf("unknown rule: %v", err)
	}
	if _, err := e.c.Members(t.Context(), "user", Row{"id": 1}); !errors.Is(err, ErrUnknownRule) {
		t.Errorf("Members of a bump rule: %v", err)
	}
}

func TestNamespaceConcurrentCreate(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	const callers = 32
	before := itemformat.NamespaceStart(time.Now())
	start := make(chan struct{})
	versions := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			versions[i], errs[i] = e.c.Namespace(t.Context(), "user", Row{"id": 7})
		})
	}
	close(start)
	wg.Wait()
	after := itemformat.NamespaceStart(time.Now())
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if versions[i] != versions[0] {
			t.Fatalf("caller %d saw version %s, caller 0 saw %s", i, versions[i], versions[0])
		}
	}
	if v, _ := strconv.ParseUint(versions[0], 10, 64); v < before || v > after {
		t.Errorf("new version %s is not NamespaceStart of the time of creation (between %d and %d)", versions[0], before, after)
	}
	if v, ok := e.value(t, e.prefix+"ns:user:7"); !ok || v != versions[0] {
		t.Fatalf("stored version: %q, %v", v, ok)
	}
}

func TestNamespaceFollowsBumps(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	key := e.prefix + "ns:user:5"
	e.set(t, key, "100")
	ns := func() (string, error) { return e.c.Namespace(t.Context(), "user", Row{"id": "5"}) }
	if v, err := ns(); err != nil || v != "100" {
		t.Fatalf("Namespace = %q, %v; want 100", v, err)
	}
	// The daemon bumps with incr.
	if _, err := e.mc.Increment(key, 1); err != nil {
		t.Fatal(err)
	}
	if v, err := ns(); err != nil || v != "101" {
		t.Fatalf("after a bump Namespace = %q, %v; want 101", v, err)
	}
	// memcached pads a number that a decrement shortened with spaces.
	e.set(t, key, "99 ")
	if v, err := ns(); err != nil || v != "99" {
		t.Fatalf("padded version: Namespace = %q, %v; want 99", v, err)
	}
	e.set(t, key, "+a +b ")
	if v, err := ns(); err == nil {
		t.Fatalf("a set item read as version %q", v)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := e.c.Namespace(ctx, "user", Row{"id": "5"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

func TestNamespacesOneRoundTrip(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	e.set(t, e.prefix+"ns:user:1", "7")
	cc := e.count()
	got, err := e.c.Namespaces(t.Context(), "user", []Row{{"id": 1}, {"id": 2}, {"id": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "7" || got[2] != "7" || got[1] == "" {
		t.Fatalf("Namespaces = %q", got)
	}
	if n := cc.getMultis.Load(); n != 1 {
		t.Errorf("%d GetMulti round trips, want 1", n)
	}
	if again, err := e.c.Namespace(t.Context(), "user", Row{"id": 2}); err != nil || again != got[1] {
		t.Errorf("created version %s not kept: %s, %v", got[1], again, err)
	}
}

// TestNamespaceRecreatedAboveDaemonVersions: a namespace the daemon bumped
// many times, evicted, and created again by a reader starts above every
// version the first incarnation handed out.
func TestNamespaceRecreatedAboveDaemonVersions(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	pw := cacheops.NewMetaApplier(e.c.sel, nil, nil, cacheops.Config{}, nil)
	defer pw.Close()
	op := rules.Op{Kind: rules.OpBump, Rule: e.rs.Rule("user"), Key: e.prefix + "ns:user:3"}
	batch := slices.Repeat([]rules.Op{op}, 1000)
	results := make([]cacheops.Result, len(batch))
	for range 20 {
		if err := pw.Apply(t.Context(), batch, results); err != nil {
			t.Fatal(err)
		}
	}
	last, _ := e.value(t, op.Key)
	if err := e.mc.Delete(op.Key); err != nil {
		t.Fatal(err)
	}
	v, err := e.c.Namespace(t.Context(), "user", Row{"id": 3})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.ParseUint(v, 10, 64); n <= mustUint(t, last) {
		t.Errorf("recreated at %s, not above %s", v, last)
	}
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMembersDecodes(t *testing.T) {
	// Compaction off: this test is about decoding only.
	e := newTestEnv(t, nil, func(c *Config) { c.CompactRatio = 2 })
	cases := []struct {
		name, stored string
		want         []string
	}{
		{"empty", "", []string{}},
		{"adds", "+a +b +c ", []string{"a", "b", "c"}},
		{"removal", "+a +b +c -b ", []string{"a", "c"}},
		{"removed then added again", "+a -a +b +a ", []string{"b", "a"}},
		{"removal of an absent member", "-x +a ", []string{"a"}},
		{"escaped members come back raw", "+a%20b +100%25 +tab%09 ", []string{"a b", "100%", "tab\t"}},
		{"foreign ops and extra whitespace ignored", "  +a\t*b \r\n+c  ", []string{"a", "c"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			row := Row{"id": i}
			key, _ := e.c.Key("tags", row)
			stored := e.stamped(t, "tags", tc.stored)
			e.set(t, key, stored)
			got, err := e.c.Members(t.Context(), "tags", row)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Members(%q) = %q, want %q", tc.stored, got, tc.want)
			}
			if v, _ := e.value(t, key); v != stored {
				t.Errorf("item changed with compaction off: %q", v)
			}
		})
	}
}

func TestMembersCompactsDirtySets(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	cases := []struct {
		name, stored, after string
	}{
		// 2 of 4 tokens are garbage: at the ratio, compacted.
		{"dirty", "+a +b -a +c ", "+b +c "},
		{"repeated adds", "+a +a +a ", "+a "},
		{"all removed", "+a -a ", ""},
		// 1 of 4 tokens is garbage: below the ratio, left alone.
		{"clean enough", "+a +b +c -x ", "+a +b +c -x "},
		{"compact", "+x%20y +z ", "+x%20y +z "},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			row := Row{"id": i}
			key, _ := e.c.Key("tags", row)
			e.set(t, key, e.stamped(t, "tags", tc.stored))
			before, err := e.c.Members(t.Context(), "tags", row)
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := e.value(t, key); v != e.stamped(t, "tags", tc.after) {
				t.Errorf("stored after read: %q, want %q", v, tc.after)
			}
			after, err := e.c.Members(t.Context(), "tags", row)
			if err != nil || !slices.Equal(before, after) {
				t.Errorf("members changed by compaction: %q then %q (%v)", before, after, err)
			}
		})
	}
}

func TestCompactionNeverDropsNewerAppends(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	key, _ := e.c.Key("tags", Row{"id": 1})
	e.set(t, key, e.stamped(t, "tags", "+a -a +b -b +c "))
	read, err := e.mc.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon appends between the reader's read and its compaction.
	if err := e.mc.Append(&memcache.Item{Key: key, Value: itemformat.AppendToken(nil, true, "d")}); err != nil {
		t.Fatal(err)
	}
	if e.c.compactSet(read, itemformat.DecodeSet(read.Value), time.Minute) {
		t.Fatal("compaction based on an outdated read was stored")
	}
	if v, _ := e.value(t, key); v != e.stamped(t, "tags", "+a -a +b -b +c +d ") {
		t.Fatalf("item after lost compaction: %q", v)
	}
	got, err := e.c.Members(t.Context(), "tags", Row{"id": 1})
	if err != nil || !slices.Equal(got, []string{"c", "d"}) {
		t.Fatalf("Members = %q, %v", got, err)
	}
	if v, _ := e.value(t, key); v != e.stamped(t, "tags", "+c +d ") {
		t.Fatalf("item after compaction on read: %q", v)
	}
}

// hookQuerier runs before ahead of each query it passes to the database.
type hookQuerier struct {
	Querier
	before func()
}

func (h hookQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if h.before != nil {
		h.before()
	}
	return h.Querier.QueryContext(ctx, query, args...)
}

func TestMembersLoadsMissingSets(t *testing.T) {
	db := testDB(t)
	for _, q := range []string{
		"INSERT INTO user_interests VALUES (1, 1, 'b', 1), (1, 2, 'a b', 1), (1, 3, '100%', 1), (1, 4, 'gone', 0), (1, 5, 'b', 1), (2, 1, 'x', 1)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	queries := 0
	var before func()
	e := newTestEnv(t, hookQuerier{Querier: db, before: func() {
		queries++
		if before != nil {
			before()
		}
	}}, nil)

	t.Run("loaded and added", func(t *testing.T) {
		want := []string{"b", "a b", "100%"}
		got, err := e.c.Members(t.Context(), "user-interests", Row{"user_id": 1})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("first Members = %q, %v; want %q", got, err, want)
		}
		if v, _ := e.value(t, e.prefix+"interests:1"); v != e.stamped(t, "user-interests", "+b +a%20b +100%25 ") {
			t.Fatalf("added set: %q", v)
		}
		got, err = e.c.Members(t.Context(), "user-interests", Row{"user_id": 1})
		if err != nil || !slices.Equal(got, want) || queries != 1 {
			t.Fatalf("second Members = %q, %v after %d queries", got, err, queries)
		}
	})

	t.Run("empty set", func(t *testing.T) {
		got, err := e.c.Members(t.Context(), "user-interests", Row{"user_id": 3})
		if err != nil || len(got) != 0 {
			t.Fatalf("Members = %q, %v", got, err)
		}
		// The empty item exists, so the daemon's appends now land.
		if err := e.mc.Append(&memcache.Item{Key: e.prefix + "interests:3", Value: itemformat.AppendToken(nil, true, "x")}); err != nil {
			t.Fatalf("append to the loaded empty set: %v", err)
		}
		got, err = e.c.Members(t.Context(), "user-interests", Row{"user_id": 3})
		if err != nil || !slices.Equal(got, []string{"x"}) {
			t.Fatalf("Members after append = %q, %v", got, err)
		}
	})

	t.Run("lost add", func(t *testing.T) {
		// Another client adds the set while this one loads.
		before = func() {
			if err := e.mc.Add(&memcache.Item{Key: e.prefix + "interests:2", Value: []byte("+other "), Expiration: 60}); err != nil {
				t.Error(err)
			}
		}
		defer func() { before = nil }()
		got, err := e.c.Members(t.Context(), "user-interests", Row{"user_id": 2})
		if err != nil || !slices.Equal(got, []string{"x"}) {
			t.Fatalf("Members = %q, %v", got, err)
		}
		if v, _ := e.value(t, e.prefix+"interests:2"); v != "+other " {
			t.Fatalf("the first add must win: %q", v)
		}
	})

	t.Run("query error", func(t *testing.T) {
		if _, err := db.Exec("RENAME TABLE user_interests TO ui_moved"); err != nil {
			t.Fatal(err)
		}
		defer db.Exec("RENAME TABLE ui_moved TO user_interests")
		if _, err := e.c.Members(t.Context(), "user-interests", Row{"user_id": 4}); err == nil {
			t.Fatal("a failed load returned members")
		}
		if _, ok := e.value(t, e.prefix+"interests:4"); ok {
			t.Fatal("a failed load stored something")
		}
	})

	t.Run("no query", func(t *testing.T) {
		if _, err := e.c.Members(t.Context(), "tags", Row{"id": 1}); !errors.Is(err, ErrMissing) || !errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("err = %v, want ErrMissing", err)
		}
	})
}

func TestCount(t *testing.T) {
	db := testDB(t)
	if _, err := db.Exec("INSERT INTO comments VALUES (1, 9, 1), (2, 9, 1), (3, 9, 0), (4, 8, 1)"); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, db, nil)
	ctx := t.Context()
	key := e.counterKey(t, "post-comments", e.prefix+"comments:9")

	// A miss is recounted and added.
	if n, err := e.c.Count(ctx, "post-comments", Row{"post_id": 9}); err != nil || n != 2 {
		t.Fatalf("Count = %d, %v; want 2", n, err)
	}
	if it, err := e.mc.Get(key); err != nil || string(it.Value) != "2" || it.Flags != itemformat.ReaderCountFlags {
		t.Fatalf("stored counter %+v, %v; want 2 marked as a reader's count (flags %#x)", it, err, itemformat.ReaderCountFlags)
	}
	// A present counter is read as it is, padding included.
	e.set(t, key, "5 ")
	if n, err := e.c.Count(ctx, "post-comments", Row{"post_id": 9}); err != nil || n != 5 {
		t.Fatalf("Count = %d, %v; want 5", n, err)
	}
	// Garbage is recounted and replaced.
	e.set(t, key, "+a ")
	if n, err := e.c.Count(ctx, "post-comments", Row{"post_id": 9}); err != nil || n != 2 {
		t.Fatalf("Count over garbage = %d, %v; want 2", n, err)
	}
	if v, _ := e.value(t, key); v != "2" {
		t.Fatalf("garbage not replaced: %q", v)
	}
	// Without a recount query a miss is an error.
	if _, err := e.c.Count(ctx, "likes", Row{"post_id": 9}); !errors.Is(err, ErrMissing) {
		t.Fatalf("no recount query: %v", err)
	}
	e.set(t, e.counterKey(t, "likes", e.prefix+"likes:9"), "17")
	if n, err := e.c.Count(ctx, "likes", Row{"post_id": 9}); err != nil || n != 17 {
		t.Fatalf("likes = %d, %v", n, err)
	}
}

// TestReadsSurviveMemcachedRestart: after memcached restarts, every idle
// connection of the pool is dead; reads still succeed (each dead
// connection is dropped and the read tried again).
func TestReadsSurviveMemcachedRestart(t *testing.T) {
	mc := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	addr := mc.Addr
	e := newTestEnv(t, nil, func(c *Config) { c.Servers = []itemformat.Server{{Addr: addr}} })
	// Fill the pool with idle connections.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, err := e.c.Namespace(t.Context(), "user", Row{"id": i}); err != nil {
				t.Error(err)
			}
			if _, err := e.c.GetOrCompute(t.Context(), "page:"+strconv.Itoa(i), time.Minute, constant("v")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// The same server restarts, empty.
	mc.Kill()
	mc.Start()
	for i := range 3 {
		if _, err := e.c.Namespace(t.Context(), "user", Row{"id": i}); err != nil {
			t.Fatalf("read %d after the restart: %v", i, err)
		}
		if v, err := e.c.GetOrCompute(t.Context(), "page:"+strconv.Itoa(i), time.Minute, constant("w")); err != nil || string(v) != "w" {
			t.Fatalf("GetOrCompute %d after the restart: %q, %v", i, v, err)
		}
	}
}
