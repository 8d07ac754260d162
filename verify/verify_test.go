package verify

import (
	"bytes"
	"context"
	"database/sql"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

func TestConsistencyText(t *testing.T) {
	tests := []struct {
		checked, wrong int
		want           string
		nines          int
	}{
		{0, 0, "100.000% (all)", -1},
		{5, 0, "100.000% (all)", -1},
		{10000, 1, "99.99% (4 nines)", 4},
		{100000, 1, "99.999% (5 nines)", 5},
		{9999, 1, "99.98% (3 nines)", 3},
		{3, 1, "66.66% (0 nines)", 0},
		{10, 1, "90.00% (1 nine)", 1},
		{200, 1, "99.50% (2 nines)", 2},
		{4, 4, "0.00% (0 nines)", 0},
		// Truncated, never rounded up to a hundred.
		{1999999, 1, "99.9999% (6 nines)", 6},
		{2000000000, 1, "99.9999999% (9 nines)", 9},
	}
	for _, tc := range tests {
		r := &Report{Checked: tc.checked, Wrong: tc.wrong}
		if got := r.ConsistencyText(); got != tc.want {
			t.Errorf("checked %d wrong %d: ConsistencyText() = %q, want %q", tc.checked, tc.wrong, got, tc.want)
		}
		if got := r.Nines(); got != tc.nines {
			t.Errorf("checked %d wrong %d: Nines() = %d, want %d", tc.checked, tc.wrong, got, tc.nines)
		}
	}
}

// fixture is a database and memcached prepared for a verification run.
type fixture struct {
	db     *sql.DB
	mc     *memcache.Client
	rs     *rules.RuleSet
	prefix string
	v      *Verifier
}

const fixtureRules = `version: 1
prefix: "%PREFIX%"
rules:
  - name: user
    table: shop.users
    bump: "ns:user:{id}"
  - name: post-comments
    table: blog.comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
      keys: "SELECT DISTINCT post_id FROM comments"
  - name: user-interests
    table: shop.user_interests
    when: "active == 1"
    set:
      key: "interests:{user_id}"
      member: "{interest}"
      load: "SELECT interest FROM user_interests WHERE user_id = ? AND active = 1"
      args: [user_id]
      keys: "SELECT DISTINCT user_id FROM user_interests"
  - name: all-comments
    table: blog.comments
    count:
      key: "comments:all"
      recount: "SELECT COUNT(*) FROM comments"
  - name: products
    table: shop.products
    set:
      key: "category:{category_id}"
      member: "{id}"
`

func newFixture(t *testing.T) *fixture {
	t.Helper()
	mcAddr := testsvc.Memcached(t)
	db, _ := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE comments (id BIGINT PRIMARY KEY, post_id BIGINT NULL, approved TINYINT(1) NOT NULL)",
		"CREATE TABLE user_interests (user_id BIGINT NOT NULL, interest VARCHAR(64) NOT NULL, active TINYINT(1) NOT NULL, PRIMARY KEY (user_id, interest))",
		`INSERT INTO comments VALUES (1, 1, 1), (2, 1, 1), (3, 1, 0), (4, 2, 1), (5, 3, 1), (6, 4, 0), (7, NULL, 1)`,
		`INSERT INTO user_interests VALUES (7, 'chess', 1), (7, 'rock climbing', 1), (7, 'go', 0),
			(8, 'jazz', 1), (9, '100% organic', 1), (10, 'ski', 0)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	prefix := "vt" + testsvc.Unique() + ":"
	rs, err := rulefile.Parse("fixture.yaml", []byte(strings.ReplaceAll(fixtureRules, "%PREFIX%", prefix)))
	if err != nil {
		t.Fatal(err)
	}
	mc := memcache.New(mcAddr)
	truth := counters.NewMySQL(db, counters.DBConfig{}, nil)
	f := &fixture{db: db, mc: mc, rs: rs, prefix: prefix, v: New(mc, truth, db, nil)}
	for _, r := range rs.Rules() {
		if r.Generation != "" {
			if err := mc.Set(&memcache.Item{Key: r.Generation, Value: []byte(strconv.FormatUint(fixtureGen, 10))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// fixtureGen is the generation of every table of the fixture.
const fixtureGen = 1782579200000000000

// itemKey returns the memcached key of the fixture's item at key (prefix
// left out): a counter's lives under its table's generation.
func (f *fixture) itemKey(key string) string {
	if strings.HasPrefix(key, "comments:") {
		return itemformat.CounterKey(f.prefix+key, fixtureGen)
	}
	return f.prefix + key
}

// set stores value at key (prefix left out) as the daemon would under the
// current generation: a counter at its generation's key, a set after the
// generation's token.
func (f *fixture) set(t *testing.T, key, value string) {
	t.Helper()
	if !strings.HasPrefix(key, "comments:") {
		value = string(itemformat.AppendGenerationToken(nil, fixtureGen)) + value
	}
	if err := f.mc.Set(&memcache.Item{Key: f.itemKey(key), Value: []byte(value), Expiration: 300}); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	// Counters: post 1 has 2 approved comments, post 2 one, post 3 one,
	// post 4 none; the NULL post makes no key.
	f.set(t, "comments:1", "2")  // right
	f.set(t, "comments:2", "10") // wrong; memcached pads the decremented number
	if _, err := f.mc.Decrement(f.itemKey("comments:2"), 7); err != nil {
		t.Fatal(err)
	}
	f.set(t, "comments:4", "0")   // right
	f.set(t, "comments:all", "x") // not a number: wrong
	// post 3's counter is missing: consistent.
	// Sets: user 7 {chess, rock climbing}; 8 {jazz}; 9 {100% organic};
	// 10 {}.
	f.set(t, "interests:7", "+go +rock%20climbing +chess -go ") // right, with garbage
	f.set(t, "interests:8", "+jazz +chess ")                    // wrong: an extra member
	f.set(t, "interests:9", "+100%25%20organic ")               // right, escaped
	f.set(t, "interests:10", "+ski -ski ")                      // right: empty

	rep, err := f.v.Verify(context.Background(), f.rs.Rules(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", text.String())

	if rep.Checked != 9 || rep.Missing != 1 || rep.Consistent != 5 || rep.Wrong != 3 {
		t.Errorf("checked %d missing %d consistent %d wrong %d, want 9 1 5 3", rep.Checked, rep.Missing, rep.Consistent, rep.Wrong)
	}
	if rep.OK() {
		t.Error("OK() = true with wrong items")
	}
	wantMismatch := map[string]Mismatch{
		// Counters are reported at their key under the generation.
		f.itemKey("comments:2"):   {Rule: "post-comments", Cached: "3", Truth: "1"},
		f.itemKey("comments:all"): {Rule: "all-comments", Cached: `"x"`, Truth: "7"},
		f.itemKey("interests:8"):  {Rule: "user-interests", Cached: "{chess jazz}", Truth: "{jazz}"},
	}
	if len(rep.Mismatches) != len(wantMismatch) {
		t.Errorf("mismatches %+v, want %d", rep.Mismatches, len(wantMismatch))
	}
	for _, m := range rep.Mismatches {
		w, ok := wantMismatch[m.Key]
		w.Key = m.Key
		if !ok || m != w {
			t.Errorf("mismatch %+v, want %+v", m, w)
		}
	}
	byRule := map[string]RuleReport{}
	for _, rr := range rep.Rules {
		byRule[rr.Rule] = rr
	}
	if rr := byRule["post-comments"]; rr.Listed != 5 || rr.NullKeys != 1 || rr.Checked != 4 {
		t.Errorf("post-comments: %+v, want 5 listed, 1 NULL, 4 checked", rr)
	}
	if rr := byRule["products"]; rr.Skipped == "" || rr.Checked != 0 {
		t.Errorf("products (no load query): %+v, want skipped", rr)
	}
	if _, ok := byRule["user"]; ok {
		t.Error("bump rule listed in the report")
	}
	for _, want := range []string{
		"MISMATCH rule=post-comments key=" + f.itemKey("comments:2") + " cached=3 truth=1",
		"skipped products (set): no load query",
		"checked 9, present 8 (88.9%), missing 1, consistent 5, wrong 3: consistency 66.66% (0 nines)",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}

	// Fix the wrong items: everything is consistent.
	f.set(t, "comments:2", "1")
	f.set(t, "comments:all", "7")
	f.set(t, "interests:8", "+jazz +chess -chess ")
	rep, err = f.v.Verify(context.Background(), f.rs.Rules(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Checked != 9 || rep.ConsistencyText() != "100.000% (all)" {
		t.Errorf("after the fix: %+v", rep)
	}

	// A signed number is no counter to readers (client.Count recounts
	// it, docs/formats.md): wrong, though its digits equal the truth.
	f.set(t, "comments:4", "+0")
	rep, err = f.v.Verify(context.Background(), f.rs.Rules(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Mismatch{Key: f.itemKey("comments:4"), Rule: "post-comments", Cached: `"+0"`, Truth: "0"}); rep.Wrong != 1 || len(rep.Mismatches) != 1 || rep.Mismatches[0] != want {
		t.Errorf("signed counter: wrong %d, mismatches %+v; want %+v", rep.Wrong, rep.Mismatches, want)
	}
}

func TestVerifyNamedRulesAndSample(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, tc := range []struct {
		names []string
		err   string
	}{
		{[]string{"nope"}, `no rule named "nope"`},
		{[]string{"user"}, `rule "user" cannot be checked: bump rules`},
		{[]string{"products"}, `rule "products" cannot be checked: no load query`},
	} {
		if _, err := f.v.Verify(ctx, f.rs.Rules(), Options{Rules: tc.names}); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("rules %v: error %v, want %q", tc.names, err, tc.err)
		}
	}
	rep, err := f.v.Verify(ctx, f.rs.Rules(), Options{Rules: []string{"user-interests"}, Sample: 2, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rules) != 1 || rep.Rules[0].Rule != "user-interests" || rep.Rules[0].Listed != 4 || rep.Checked != 2 {
		t.Errorf("sampled run: %+v", rep)
	}
	// Sampling covers every key over enough runs.
	seen := map[int]bool{}
	for seed := range uint64(40) {
		f.set(t, "interests:7", "+chess ") // wrong: lacks rock climbing
		rep, err := f.v.Verify(ctx, f.rs.Rules(), Options{Rules: []string{"user-interests"}, Sample: 1, Rand: rand.New(rand.NewPCG(seed, 7))})
		if err != nil {
			t.Fatal(err)
		}
		seen[rep.Wrong] = true
	}
	if !seen[0] || !seen[1] {
		t.Errorf("40 samples of one key out of 4 never or always hit the wrong one: %v", seen)
	}
}

// fixingCache is the real memcached client, with a hook run after the
// first read of items (not of a generation), to change the cache between
// a check and its recheck.
type fixingCache struct {
	*memcache.Client
	once  sync.Once
	after func()
}

func (c *fixingCache) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	items, err := c.Client.GetMulti(keys)
	if len(keys) != 1 || !strings.Contains(keys[0], "%gen:") {
		c.once.Do(c.after)
	}
	return items, err
}

func TestVerifyRecheck(t *testing.T) {
	f := newFixture(t)
	f.set(t, "comments:1", "5") // wrong at first, fixed before the recheck
	cache := &fixingCache{Client: f.mc, after: func() { f.set(t, "comments:1", "2") }}
	v := New(cache, counters.NewMySQL(f.db, counters.DBConfig{}, nil), f.db, nil)
	rep, err := v.Verify(context.Background(), f.rs.Rules(), Options{Rules: []string{"post-comments"}, Recheck: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Wrong != 0 || rep.Consistent != 1 {
		t.Errorf("with recheck: %+v, want the fixed key consistent", rep)
	}

	f.set(t, "comments:1", "5")
	cache = &fixingCache{Client: f.mc, after: func() { f.set(t, "comments:1", "2") }}
	v = New(cache, counters.NewMySQL(f.db, counters.DBConfig{}, nil), f.db, nil)
	rep, err = v.Verify(context.Background(), f.rs.Rules(), Options{Rules: []string{"post-comments"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Wrong != 1 {
		t.Errorf("without recheck: %+v, want the first reading wrong", rep)
	}
}

func TestMinPresent(t *testing.T) {
	cases := []struct {
		flag             string
		checked, missing int
		fail             bool
	}{
		{"0", 0, 0, false},
		{"1", 0, 0, true}, // an empty cache, a wrong prefix or distribution
		{"1", 10, 10, true},
		{"1", 10, 9, false},
		{"50%", 10, 6, true},
		{"50%", 10, 5, false},
		{"50%", 0, 0, true},
		{"100%", 4, 0, false},
	}
	for _, c := range cases {
		min, err := ParseMinPresent(c.flag)
		if err != nil {
			t.Fatalf("%q: %v", c.flag, err)
		}
		rep := &Report{Checked: c.checked, Missing: c.missing}
		if err := rep.CheckPresent(min); (err != nil) != c.fail {
			t.Errorf("min-present %s, checked %d, missing %d: error %v, want failure %v", c.flag, c.checked, c.missing, err, c.fail)
		}
	}
	for _, bad := range []string{"-1", "x", "150%", "%"} {
		if _, err := ParseMinPresent(bad); err == nil {
			t.Errorf("ParseMinPresent(%q) accepted", bad)
		}
	}
	var text strings.Builder
	(&Report{Checked: 3, Missing: 3, Consistent: 3}).WriteText(&text)
	if !strings.Contains(text.String(), "warning: no checked item was present") {
		t.Errorf("no warning for a check that saw no item:\n%s", text.String())
	}
}

// TestVerifyGenerations: a set of another generation than its table's,
// and every set and counter of a table whose generation item is missing,
// are missing to readers (docs/formats.md, "Generations"), so verify
// counts them missing, not wrong.
func TestVerifyGenerations(t *testing.T) {
	f := newFixture(t)
	// User 8's set lacks jazz, but under an earlier generation.
	stale := string(itemformat.AppendGenerationToken(nil, fixtureGen-1)) + "+chess "
	if err := f.mc.Set(&memcache.Item{Key: f.prefix + "interests:8", Value: []byte(stale)}); err != nil {
		t.Fatal(err)
	}
	// A set without a generation token is of no generation.
	if err := f.mc.Set(&memcache.Item{Key: f.prefix + "interests:9", Value: []byte("+nothing ")}); err != nil {
		t.Fatal(err)
	}
	f.set(t, "interests:7", "+chess +rock%20climbing ") // right
	f.set(t, "comments:1", "7")                         // wrong, until the generation goes
	rep, err := f.v.Verify(context.Background(), f.rs.Rules(), Options{Rules: []string{"user-interests"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Wrong != 0 || rep.Consistent != 1 {
		t.Errorf("sets: %+v; want the stale sets missing and user 7's consistent", rep)
	}
	rule := f.rs.Rule("post-comments")
	if err := f.mc.Delete(rule.Generation); err != nil {
		t.Fatal(err)
	}
	rep, err = f.v.Verify(context.Background(), f.rs.Rules(), Options{Rules: []string{"post-comments"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Wrong != 0 || rep.Missing != rep.Checked || rep.Checked == 0 {
		t.Errorf("counters without a generation: %+v; want every one missing", rep)
	}
}
