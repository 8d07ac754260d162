package client

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// forgeRules key a set and a counter by a text column, so a row's value
// can spell any key after the literal head.
const forgeRules = `
  - name: doc-tags
    table: doc_tags
    set:
      key: "doctags:{doc}"
      member: "{tag}"
      load: "SELECT tag FROM doc_tags WHERE doc = ?"
  - name: doc-likes
    table: doc_likes
    count:
      key: "doclikes:{doc}"
      recount: "SELECT COUNT(*) FROM doc_likes WHERE doc = ?"
`

// TestForgedKeyLeavesVictimAlone: a document whose name is longer than a
// key can hold has its set and its counter at hashed keys. Another row
// whose name spells exactly such a hashed key (after the template's
// literal head) gets items of its own: through the daemon's writer on a
// real memcached and MariaDB, the victim's set and counter keep what
// MySQL says, and the forger's items hold the forger's rows.
func TestForgedKeyLeavesVictimAlone(t *testing.T) {
	db := testDB(t)
	for _, q := range []string{
		"CREATE TABLE doc_tags (doc VARCHAR(400), tag VARCHAR(64))",
		"CREATE TABLE doc_likes (id INT AUTO_INCREMENT PRIMARY KEY, doc VARCHAR(400))",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	e := newTestEnv(t, db, nil)
	rs, err := rulefile.Parse("forge.yaml", []byte(strings.ReplaceAll(testRules+forgeRules, "%PREFIX%", e.prefix)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.c.cfg
	cfg.Rules = rs
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e.c, e.rs = c, rs
	ctx := t.Context()
	mysql := counters.NewMySQL(db, counters.DBConfig{}, nil)
	pw := cacheops.NewMetaApplier(e.c.sel, mysql, mysql, cacheops.Config{}, nil)
	defer pw.Close()

	str := func(s string) rules.Value { return rules.Value{Kind: rules.KindString, Text: s} }
	// insert stores a row in MariaDB, then applies its change event.
	insert := func(table, doc string, tag ...string) {
		t.Helper()
		row := rules.Row{{Name: "doc", Value: str(doc)}}
		q, args := "INSERT INTO doc_likes (doc) VALUES (?)", []any{doc}
		if len(tag) > 0 {
			row = append(row, rules.Column{Name: "tag", Value: str(tag[0])})
			q, args = "INSERT INTO doc_tags VALUES (?, ?)", []any{doc, tag[0]}
		}
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
		ops, _, err := e.rs.Plan(nil, &rules.Event{Table: table, Operation: rules.Insert, After: row})
		if err != nil {
			t.Fatal(err)
		}
		res := make([]cacheops.Result, len(ops))
		if err := pw.Apply(ctx, ops, res); err != nil {
			t.Fatal(err)
		}
	}
	// spelling returns a document name that renders key after prefix and
	// head: the key itself, as a value.
	spelling := func(key, head string) string {
		t.Helper()
		if !strings.HasPrefix(key, e.prefix+head) || len(key) > rules.MaxKeyLen {
			t.Fatalf("key %q", key)
		}
		return strings.TrimPrefix(key, e.prefix+head)
	}

	victim := strings.Repeat("v", 300)
	tagsKey, err := e.c.Key("doc-tags", Row{"doc": victim})
	if err != nil {
		t.Fatal(err)
	}
	likesKey, err := e.c.Key("doc-likes", Row{"doc": victim})
	if err != nil {
		t.Fatal(err)
	}
	insert("doc_tags", victim, "victim-member")
	insert("doc_likes", victim)
	forgedTags, forgedLikes := spelling(tagsKey, "doctags:"), spelling(likesKey, "doclikes:")
	insert("doc_tags", forgedTags, "evil")
	insert("doc_likes", forgedLikes)

	if ms, err := e.c.Members(ctx, "doc-tags", Row{"doc": victim}); err != nil || !slices.Equal(ms, []string{"victim-member"}) {
		t.Errorf("the victim's set reads %q, %v; want [victim-member]", ms, err)
	}
	if n, err := e.c.Count(ctx, "doc-likes", Row{"doc": victim}); err != nil || n != 1 {
		t.Errorf("the victim's counter reads %d, %v; MySQL says 1", n, err)
	}
	if ms, err := e.c.Members(ctx, "doc-tags", Row{"doc": forgedTags}); err != nil || !slices.Equal(ms, []string{"evil"}) {
		t.Errorf("the forger's set reads %q, %v; want [evil]", ms, err)
	}
	if n, err := e.c.Count(ctx, "doc-likes", Row{"doc": forgedLikes}); err != nil || n != 1 {
		t.Errorf("the forger's counter reads %d, %v; MySQL says 1", n, err)
	}
	// Both were written by the daemon, not created by the reads above.
	for _, doc := range []string{victim, forgedTags} {
		k, _ := e.c.Key("doc-tags", Row{"doc": doc})
		if _, ok := e.value(t, k); !ok {
			t.Errorf("no set item at %q", k)
		}
	}
}

// TestLegacyKeysInvalidated: readers of releases before the "%#" and
// "%copy" marks read a long key's items, and a hot namespace's copies, at
// the keys those releases made ('#' where the marks now stand). Through
// the daemon's writer on a real memcached, a change still moves them: the
// old copy's version is bumped and the old set item deleted, so a reader
// not yet upgraded never keeps serving what the daemon no longer writes.
func TestLegacyKeysInvalidated(t *testing.T) {
	db := testDB(t)
	if _, err := db.Exec("CREATE TABLE doc_tags (doc VARCHAR(400), tag VARCHAR(64))"); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, db, nil)
	rs, err := rulefile.Parse("legacy.yaml", []byte(strings.ReplaceAll(testRules+forgeRules+`
  - name: hot-catalog
    table: catalog
    bump: "ns:hotcat:{id}"
    copies: 2
`, "%PREFIX%", e.prefix)))
	if err != nil {
		t.Fatal(err)
	}
	mysql := counters.NewMySQL(db, counters.DBConfig{}, nil)
	pw := cacheops.NewMetaApplier(e.c.sel, mysql, mysql, cacheops.Config{}, nil)
	defer pw.Close()
	apply := func(ev rules.Event) {
		t.Helper()
		ops, _, err := rs.Plan(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		res := make([]cacheops.Result, len(ops))
		if err := pw.Apply(t.Context(), ops, res); err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("op %s %s: %v", ops[i].Kind, ops[i].Key, r.Err)
			}
		}
	}
	str := func(s string) rules.Value { return rules.Value{Kind: rules.KindString, Text: s} }

	// What a reader of an earlier release cached: a version at the old
	// copy key, a set at the old hashed key.
	oldCopy := e.prefix + "ns:hotcat:7#1"
	e.set(t, oldCopy, "1782579200000000000")
	doc := strings.Repeat("d", 300)
	full := e.prefix + "doctags:" + doc
	sum := sha256.Sum256([]byte(full))
	oldSet := full[:200] + "#" + hex.EncodeToString(sum[:16])
	e.set(t, oldSet, "+stale-member ")

	apply(rules.Event{Table: "catalog", Operation: rules.Update, Before: rules.Row{{Name: "id", Value: str("7")}}, After: rules.Row{{Name: "id", Value: str("7")}}})
	if v, ok := e.value(t, oldCopy); !ok || v == "1782579200000000000" {
		t.Errorf("the old copy key %s holds %q (present %v): not bumped", oldCopy, v, ok)
	}
	if _, err := db.Exec("INSERT INTO doc_tags VALUES (?, 'fresh')", doc); err != nil {
		t.Fatal(err)
	}
	apply(rules.Event{Table: "doc_tags", Operation: rules.Insert, After: rules.Row{{Name: "doc", Value: str(doc)}, {Name: "tag", Value: str("fresh")}}})
	if v, ok := e.value(t, oldSet); ok {
		t.Errorf("the old hashed set key still holds %q", v)
	}
}
