package inspect_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/inspect"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// newPool loads testdata/rules.yaml under a unique prefix over the shared
// memcached, writing through the text protocol's Applier.
func newPool(t *testing.T) (*inspect.Pool, string) {
	t.Helper()
	addr := testsvc.Memcached(t)
	prefix := "cwinspect:" + testsvc.Unique() + ":"
	data, err := os.ReadFile("testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), "PREFIX", prefix, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := itemformat.NewSelector(itemformat.DefaultDistribution, []itemformat.Server{{Addr: addr}})
	if err != nil {
		t.Fatal(err)
	}
	mc := memcache.NewFromSelector(sel)
	return &inspect.Pool{Name: "p", Rules: rs, Servers: sel, Cache: mc,
		Applier: cacheops.NewTextApplier(mc, nil, nil, cacheops.Config{}, nil)}, prefix
}

// TestKeyMeanings stores items in memcached as the daemon and readers
// leave them and checks what Key says each means.
func TestKeyMeanings(t *testing.T) {
	p, prefix := newPool(t)
	mc := p.Cache.(*memcache.Client)
	bit := rules.EvidenceBit("9", 64)
	master := itemformat.NewMaster(77, 64)
	master.Evidence[bit/8] |= 0x80 >> (bit % 8)
	setGen := rules.GenerationKey(prefix, "shop", "user_interests")
	countGen := rules.GenerationKey(prefix, "blog", "views")
	counter := itemformat.CounterKey(prefix+"views:3", 500)
	items := []*memcache.Item{
		{Key: prefix + "ns:member:9", Value: []byte("123")},
		{Key: prefix + "ns:member:master", Value: master.Encode()},
		{Key: setGen, Value: []byte("400")},
		{Key: prefix + "interests:1", Value: itemformat.EncodeSetAt(400, []string{"a%20b", "c"})},
		{Key: prefix + "interests:2", Value: itemformat.EncodeSetAt(399, []string{"old"})},
		{Key: countGen, Value: []byte("500")},
		{Key: counter, Value: []byte("12  "), Flags: 7 << 16},
		{Key: counter + "%fence", Value: []byte("2 458752 120 1 - mysql-bin.000003")},
	}
	for _, it := range items {
		if err := mc.Set(it); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		rule   string
		entity string
		want   []string // "role: meaning substring", in order
	}{
		{"member", "id=9", []string{"namespace: namespace version 123", "evidence master: master version 77, 1 of 64 evidence bits set; the entity's bit " + strconv.Itoa(bit) + " is set: readers use the entity's own namespace"}},
		{"member", "id=10", []string{"namespace: missing: readers create it", "evidence master: master version 77"}},
		{"interests", "user_id=1", []string{"generation: generation 400", "set: set of 2 members (2 tokens, 0 removals)"}},
		{"interests", "user_id=2", []string{"generation: generation 400", "set: a set of generation 399, not the current generation 400: readers take it as missing"}},
		{"interests", "user_id=3", []string{"generation: generation 400", "set: missing: readers will load it"}},
		{"views", "post_id=3", []string{"generation: generation 500", "counter: count 12, recounted at fence id 458752", "fence: fence id 458752 at mysql-bin.000003:120, server id 1: the counter is that recount plus the deltas after it"}},
		{"views", "post_id=4", []string{"generation: generation 500", "counter: missing: readers will recount it", "fence: missing"}},
	}
	for _, tc := range tests {
		rep, err := inspect.Key(context.Background(), []*inspect.Pool{p}, tc.rule, []string{tc.entity})
		if err != nil {
			t.Fatal(err)
		}
		got := rep.Pools[0].Items
		if len(got) != len(tc.want) || rep.Failed() {
			t.Errorf("%s %s: items %+v, want %d", tc.rule, tc.entity, got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			role, meaning, _ := strings.Cut(w, ": ")
			if got[i].Role != role || !strings.Contains(got[i].Meaning, meaning) {
				t.Errorf("%s %s item %d: %s: %q, want %s: %q", tc.rule, tc.entity, i, got[i].Role, got[i].Meaning, role, meaning)
			}
		}
	}
	rep, _ := inspect.Key(context.Background(), []*inspect.Pool{p}, "interests", []string{"user_id=1"})
	if m := rep.Pools[0].Items[1].Members; len(m) != 2 || m[0] != "a%20b" || m[1] != "c" {
		t.Errorf("members %q, want the escaped members a%%20b c", m)
	}
}

// TestApplyTableOps bumps a table's fallback namespace and generation
// through the Applier (nothing in a dry run) and logs one line per op.
func TestApplyTableOps(t *testing.T) {
	p, prefix := newPool(t)
	ops, err := p.TableOps("shop.user_interests")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{prefix + "ns:table:shop.user_interests", rules.GenerationKey(prefix, "shop", "user_interests")}
	if len(ops) != 2 || ops[0].Key != want[0] || ops[1].Key != want[1] {
		t.Fatalf("ops %+v, want bumps of %q", ops, want)
	}
	var log strings.Builder
	logger := slog.New(slog.NewTextHandler(&log, nil))
	for _, dry := range []bool{true, false} {
		acts := p.Apply(context.Background(), ops, dry, logger)
		for i, a := range acts {
			_, err := p.Cache.(*memcache.Client).Get(a.Key)
			switch {
			case dry && (a.Result != "dry run" || err != memcache.ErrCacheMiss):
				t.Errorf("dry run: %+v sent (%v)", a, err)
			case !dry && (a.Result != "added" || err != nil):
				t.Errorf("op %d: %+v (%v)", i, a, err)
			}
		}
	}
	if n := strings.Count(log.String(), `msg="invalidated by hand" pool=p`); n != 2 {
		t.Errorf("%d log lines of applied ops, want 2:\n%s", n, log.String())
	}
	if _, err := p.TableOps("shop.nothing"); err == nil || !strings.Contains(err.Error(), `no rule of table "shop.nothing"`) {
		t.Errorf("unknown table: %v", err)
	}
}
