package client

import (
	"context"
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
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// hotRules adds a rule with copies and a rule with evidence to testRules.
const hotRules = `
  - name: catalog
    table: products
    on: [insert, truncate]
    bump: "ns:catalog"
    copies: 4
  - name: member
    table: members
    bump: "ns:member:{id}"
    evidence: {master: "ns:member:master", bits: 16, max_set: 3}
`

// newHotEnv is newTestEnv with hotRules and no DB.
func newHotEnv(t *testing.T, adjust func(*Config)) *testEnv {
	t.Helper()
	return newHotEnvDB(t, nil, adjust)
}

// newHotEnvDB is newTestEnv with hotRules.
func newHotEnvDB(t *testing.T, db Querier, adjust func(*Config)) *testEnv {
	t.Helper()
	e := newTestEnv(t, db, nil)
	rs, err := rulefile.Parse("hot.yaml", []byte(strings.ReplaceAll(testRules+hotRules, "%PREFIX%", e.prefix)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.c.cfg
	cfg.Rules = rs
	if adjust != nil {
		adjust(&cfg)
	}
	c, err := New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e.c, e.rs = c, rs
	return e
}

// writers returns the daemon's two writers over e's server.
func (e *testEnv) writers(t *testing.T) map[string]interface {
	Apply(context.Context, []rules.Op, []cacheops.Result) error
} {
	pw := cacheops.NewMetaApplier(e.c.sel, nil, nil, cacheops.Config{}, nil)
	t.Cleanup(func() { pw.Close() })
	return map[string]interface {
		Apply(context.Context, []rules.Op, []cacheops.Result) error
	}{
		"pipelined": pw,
		"text":      cacheops.NewTextApplier(e.mc, nil, nil, cacheops.Config{}, nil),
	}
}

// bump has writer apply the bumps the rules plan for inserting rows into
// table.
func (e *testEnv) bump(t *testing.T, w interface {
	Apply(context.Context, []rules.Op, []cacheops.Result) error
}, table string, ids ...string) {
	t.Helper()
	var ops []rules.Op
	for _, id := range ids {
		var err error
		ops, _, err = e.rs.Plan(ops, &rules.Event{Table: table, Operation: rules.Insert,
			After: rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: id}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Apply(t.Context(), ops, make([]cacheops.Result, len(ops))); err != nil {
		t.Fatal(err)
	}
}

// TestHotKeyCopies: the daemon bumps every copy of a namespace together;
// readers pick copies at random, so each copy takes a share of the reads.
func TestHotKeyCopies(t *testing.T) {
	e := newHotEnv(t, nil)
	for name, w := range e.writers(t) {
		t.Run(name, func(t *testing.T) {
			keys, err := e.c.rules["catalog"].CopyKeys(Row{})
			if err != nil || len(keys) != 4 || keys[3] != e.prefix+"ns:catalog%copy3" {
				t.Fatalf("copy keys %q, %v", keys, err)
			}
			for _, k := range keys {
				e.mc.Delete(k)
			}
			e.bump(t, w, "products", "1")
			first, _ := e.value(t, keys[0])
			for _, k := range keys {
				if v, ok := e.value(t, k); !ok || v != first {
					t.Fatalf("copy %s = %q, %v; copy 0 = %q: a bump creates them alike", k, v, ok, first)
				}
			}
			// Tell the copies apart to see which one each read takes.
			for i, k := range keys {
				e.set(t, k, strconv.Itoa(100+i))
			}
			e.bump(t, w, "products", "2")
			seen := map[string]int{}
			for range 400 {
				v, err := e.c.Namespace(t.Context(), "catalog", Row{})
				if err != nil {
					t.Fatal(err)
				}
				seen[v]++
			}
			for i := range keys {
				if v := strconv.Itoa(101 + i); seen[v] < 40 {
					t.Errorf("copy %d (bumped to %s) read %d times of 400: %v", i, v, seen[v], seen)
				}
			}
			if len(seen) != 4 {
				t.Errorf("versions read: %v", seen)
			}
		})
	}
}

// TestNamespaceHold: with a hold, a version read once is served from the
// process, without a round trip, and a bump is seen only once the hold
// has passed; without one, at once.
func TestNamespaceHold(t *testing.T) {
	e := newHotEnv(t, func(c *Config) { c.NamespaceHold = time.Hour })
	cc := e.count()
	key := e.prefix + "ns:user:5"
	e.set(t, key, "100")
	for range 3 {
		if v, err := e.c.Namespace(t.Context(), "user", Row{"id": 5}); err != nil || v != "100" {
			t.Fatalf("Namespace = %q, %v", v, err)
		}
	}
	if n := cc.getMultis.Load() + cc.gets.Load(); n != 1 {
		t.Errorf("%d round trips for three reads within the hold, want 1", n)
	}
	if _, err := e.mc.Increment(key, 1); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.c.Namespace(t.Context(), "user", Row{"id": 5}); v != "100" {
		t.Errorf("a held version changed to %q before the hold passed", v)
	}
	e.c.hold.d = 0 // every held value is due now
	e.c.hold.put(key, uint64(0))
	if v, _ := e.c.Namespace(t.Context(), "user", Row{"id": 5}); v != "101" {
		t.Errorf("after the hold: %q, want the bumped 101", v)
	}
}

// TestEvidence: entities whose bit is clear share the master version, read
// with one round trip; the daemon's bump sets the entity's bit, and its
// readers move to the entity's own (bumped) namespace; too many bits roll
// the master to a new version.
func TestEvidence(t *testing.T) {
	for name := range newHotEnv(t, nil).writers(t) {
		t.Run(name, func(t *testing.T) {
			e := newHotEnv(t, nil)
			w := e.writers(t)[name]
			cc := e.count()
			ctx := t.Context()
			rows := []Row{{"id": 1}, {"id": 2}, {"id": 3}, {"id": 18}}
			vs, err := e.c.Namespaces(ctx, "member", rows)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(vs[0], "m") || vs[1] != vs[0] || vs[2] != vs[0] || vs[3] != vs[0] {
				t.Fatalf("versions %q, want the master's for all", vs)
			}
			if n := cc.gets.Load() + cc.getMultis.Load(); n != 1 {
				t.Errorf("%d round trips, want 1 (the master)", n)
			}
			m0 := vs[0]

			// The daemon bumps member 2: bit 2 (and so member 18's).
			e.bump(t, w, "members", "2")
			vs, err = e.c.Namespaces(ctx, "member", rows)
			if err != nil {
				t.Fatal(err)
			}
			own, _ := e.value(t, e.prefix+"ns:member:2")
			if vs[0] != m0 || vs[2] != m0 || vs[1] != own || strings.HasPrefix(vs[3], "m") {
				t.Fatalf("after bumping 2: %q (own namespace of 2: %q)", vs, own)
			}
			// A second bump changes member 2's version, not the others'.
			e.bump(t, w, "members", "2")
			again, _ := e.c.Namespaces(ctx, "member", rows)
			if again[0] != m0 || again[1] == vs[1] {
				t.Fatalf("after bumping 2 again: %q, before %q", again, vs)
			}

			// Three more bits would make four of at most three: the master
			// rolls, and every entity reads a new master version.
			e.bump(t, w, "members", "4", "5", "6")
			vs, _ = e.c.Namespaces(ctx, "member", append(rows, Row{"id": 4}))
			for i, v := range vs {
				if v != vs[0] || v == m0 || !strings.HasPrefix(v, "m") {
					t.Fatalf("after the roll: %q (entity %v), before %q", vs, rows[min(i, len(rows)-1)], m0)
				}
			}
			mv, _ := strconv.ParseUint(strings.TrimPrefix(vs[0], "m"), 10, 64)
			if old, _ := strconv.ParseUint(strings.TrimPrefix(m0, "m"), 10, 64); mv != old+1 {
				t.Errorf("rolled master %d, want %d+1", mv, old)
			}
		})
	}
}

// TestEvidenceConcurrentDaemons: daemons marking one master at once lose
// no bit (compare-and-swap, read again on a conflict).
func TestEvidenceConcurrentDaemons(t *testing.T) {
	e := newHotEnv(t, nil)
	if _, err := e.c.Namespace(t.Context(), "member", Row{"id": 1}); err != nil { // creates the master
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			pw := cacheops.NewMetaApplier(e.c.sel, nil, nil, cacheops.Config{}, nil)
			defer pw.Close()
			e.bump(t, pw, "members", strconv.Itoa(8+i))
		})
	}
	wg.Wait()
	it, err := e.mc.Get(e.prefix + "ns:member:master")
	if err != nil {
		t.Fatal(err)
	}
	m, err := itemformat.DecodeMaster(it.Value, 16)
	if err != nil || m.Count() != 3 || !m.Has(8) || !m.Has(9) || !m.Has(10) {
		t.Fatalf("master %q (%v): want bits 8, 9 and 10", it.Value, err)
	}
}

// TestEvidenceMasterRecreated: a missing or unreadable master is replaced
// by a new version with every bit clear.
func TestEvidenceMasterRecreated(t *testing.T) {
	e := newHotEnv(t, nil)
	key := e.prefix + "ns:member:master"
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte("7 00ff"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	v, err := e.c.Namespace(t.Context(), "member", Row{"id": 3})
	if err != nil || v != "m7" {
		t.Fatalf("Namespace = %q, %v; want m7 (bit 3 is clear)", v, err)
	}
	if v, err := e.c.Namespace(t.Context(), "member", Row{"id": 9}); err != nil || strings.HasPrefix(v, "m") {
		t.Fatalf("Namespace = %q, %v; bit 9 is set: want member 9's own version", v, err)
	}
	e.set(t, key, "garbage")
	v, err = e.c.Namespace(t.Context(), "member", Row{"id": 9})
	if err != nil || v == "m7" || !strings.HasPrefix(v, "m") {
		t.Fatalf("over garbage: %q, %v; want a new master version", v, err)
	}
	if got, _ := e.value(t, key); got != strings.TrimPrefix(v, "m")+" 0000" {
		t.Errorf("master item %q", got)
	}
}
