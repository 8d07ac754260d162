package rules_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// forgeRules has a set rule and a counter rule whose keys end in a
// placeholder, so a value can spell any text after the literal head, and
// a bump rule with copies and one with evidence.
const forgeRules = `version: 1
prefix: "p:"
rules:
  - name: tags
    table: blog.tags
    set:
      key: "tags:{post_id}"
      member: "{tag}"
  - name: comments
    table: blog.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
  - name: hot
    table: shop.catalog
    bump: "ns:cat:{id}"
    copies: 4
  - name: catalog-count
    table: shop.catalog_stats
    count:
      key: "ns:cat:{id}"
      recount: "SELECT COUNT(*) FROM catalog WHERE id = ?"
  - name: member
    table: shop.members
    bump: "ns:member:{id}"
    evidence:
      master: "ns:members:master"
`

// TestForgedKeys: a row whose value renders exactly the shortened form of
// another row's long key, or a key derived from another row's key (a hot
// copy, a hashed copy), plans ops on keys of its own, never on the
// victim's item.
func TestForgedKeys(t *testing.T) {
	rs, err := rulefile.Parse("forge.yaml", []byte(forgeRules))
	if err != nil {
		t.Fatal(err)
	}
	victim := strings.Repeat("v", 300)
	// plan returns the ops of this release's keys: the invalidations of
	// earlier releases' keys (rules.Op.Legacy) are for readers that still
	// use them, which a forged key could always reach.
	plan := func(table string, cols ...string) []rules.Op {
		t.Helper()
		ops, _, err := rs.Plan(nil, &rules.Event{Database: strings.Split(table, ".")[0], Table: strings.Split(table, ".")[1], Operation: rules.Insert, After: row(cols...)})
		if err != nil {
			t.Fatal(err)
		}
		return slices.DeleteFunc(ops, func(op rules.Op) bool { return op.Legacy })
	}
	// forgery returns the value that, after the literal head of a
	// template, renders key: key without "p:" + head.
	forgery := func(key, head string) string {
		t.Helper()
		if !strings.HasPrefix(key, "p:"+head) {
			t.Fatalf("key %q does not start with %q", key, "p:"+head)
		}
		return strings.TrimPrefix(key, "p:"+head)
	}
	distinct := func(what string, victim, forged []rules.Op) {
		t.Helper()
		if len(victim) == 0 || len(forged) == 0 {
			t.Fatalf("%s: no ops (%d, %d)", what, len(victim), len(forged))
		}
		for _, v := range victim {
			for _, f := range forged {
				if v.Key == f.Key {
					t.Errorf("%s: the forged row's %s lands on the victim's item %s", what, f.Kind, abbrev(v.Key))
				}
				checkLegalKey(t, f.Key)
			}
		}
	}

	set := plan("blog.tags", "post_id='"+victim+"'", "tag='victim-member'")
	distinct("set", set, plan("blog.tags", "post_id='"+forgery(set[0].Key, "tags:")+"'", "tag='evil'"))

	cnt := plan("blog.comments", "post_id='"+victim+"'")
	distinct("counter", cnt, plan("blog.comments", "post_id='"+forgery(cnt[0].Key, "comments:")+"'"))

	// A hot namespace's copies, short and long: neither a value of the same
	// rule nor one of a counter keyed alike spells a copy's key.
	for _, id := range []string{"7", victim} {
		hot := plan("shop.catalog", "id='"+id+"'")
		for _, c := range hot {
			v := forgery(c.Key, "ns:cat:")
			distinct("copy "+abbrev(c.Key), hot, plan("shop.catalog", "id='"+v+"'"))
			distinct("copy "+abbrev(c.Key)+" by a counter", hot, plan("shop.catalog_stats", "id='"+v+"'"))
		}
	}

	// The master item of a namespace with evidence.
	mk := rs.Rule("member").Evidence.MasterKey
	if k, err := rules.Key("p:", "ns:member:{id}", map[string]string{"id": strings.TrimPrefix(mk, "p:ns:member:")}); err == nil && k == mk {
		t.Errorf("an entity id renders the master key %q", mk)
	}
}

// TestForgedKeyText: Key never returns the shortened form of a different
// text for a value that spells it.
func TestForgedKeyText(t *testing.T) {
	for _, victim := range []string{strings.Repeat("v", 300), strings.Repeat("%", 100), strings.Repeat("é", 200)} {
		long := mustKey(t, "p:", "k:{v}", map[string]string{"v": victim})
		if len(long) > rules.MaxKeyLen {
			t.Fatalf("long key of %d bytes", len(long))
		}
		spelled := strings.TrimPrefix(long, "p:k:")
		if got := mustKey(t, "p:", "k:{v}", map[string]string{"v": spelled}); got == long {
			t.Errorf("value %s renders the shortened key of a %d-byte value", abbrev(spelled), len(victim))
		}
		fence := rules.FinishKey([]byte(long + "%fence"))
		if got := mustKey(t, "p:", "k:{v}", map[string]string{"v": strings.TrimPrefix(fence, "p:k:")}); got == fence {
			t.Errorf("a value renders the fence key %s", abbrev(fence))
		}
	}
}

// abbrev quotes a long key by its ends.
func abbrev(k string) string {
	if len(k) <= 60 {
		return fmt.Sprintf("%q", k)
	}
	return fmt.Sprintf("%q…%q (%d bytes)", k[:12], k[len(k)-44:], len(k))
}

// FuzzKeyMarks: for any prefix and template that load and any two values,
// two rendered keys that differ finish as different memcached keys, and
// no finished key equals a copy's key of another rendering: the shortened
// form and the copy suffix carry marks no rendering holds.
func FuzzKeyMarks(f *testing.F) {
	victim := strings.Repeat("v", 300)
	hashed := mustKey(f, "p:", "k:{a}", map[string]string{"a": victim})
	f.Add("p:", "k:{a}", victim, strings.TrimPrefix(hashed, "p:k:"), uint8(0))
	f.Add("p:", "k:{a}", "7", "7%copy1", uint8(1))
	f.Add("", "{a}#", strings.Repeat("é", 130), "x#0", uint8(2))
	f.Add("%25", "%41{a}%20", "%", "% ", uint8(3))
	f.Fuzz(func(t *testing.T, prefix, tmpl, va, vb string, copy uint8) {
		if rules.CheckLiteral(prefix) != nil {
			return
		}
		tp, err := rules.ParseTemplate(tmpl)
		if err != nil {
			return
		}
		render := func(v string) []byte {
			b, _, _ := tp.AppendRendered([]byte(prefix), func(string) (string, bool) { return v, true })
			return b
		}
		ra, rb := render(va), render(vb)
		for _, r := range [][]byte{ra, rb} {
			if err := rules.CheckLiteral(string(r)); err != nil {
				t.Fatalf("rendered key %q: %v", r, err)
			}
		}
		ka, kb := rules.FinishKey(ra), rules.FinishKey(rb)
		checkLegalKey(t, ka)
		if string(ra) != string(rb) && ka == kb {
			t.Fatalf("renderings %q and %q share the key %q", ra, rb, ka)
		}
		if ck := rules.CopyKey(ra, int(copy%rules.MaxCopies)); ck == kb {
			t.Fatalf("rendering %q spells the key %q of a copy of %q", rb, ck, ra)
		}
	})
}

func TestCanRender(t *testing.T) {
	digits := func(_, s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }
	for _, tc := range []struct {
		prefix, tmpl, key string
		accept            func(string, string) bool
		want              bool
	}{
		{"p:", "ns:member:{id}", "p:ns:member:master", nil, true},
		{"p:", "ns:member:{id}", "p:ns:member:master", digits, false},
		{"p:", "ns:member:{id}", "p:ns:member:42", digits, true},
		{"p:", "ns:member:{id}", "p:ns:members:master", nil, false},
		{"p:", "ns:member:{id}", "q:ns:member:master", nil, false},
		{"", "{a}:{a}", "x:x", nil, true},
		{"", "{a}:{a}", "x:y", nil, false},
		{"", "{a}:{b}", "x:y:z", nil, true},
		{"", "k:{a}", "k:a b", nil, false},     // a value's space is escaped
		{"", "k:{a}", "k:a%20b", nil, true},    // as here
		{"", "k:{a}", "k:x%#0123", nil, false}, // no value spells a mark
		{"", "lit", "lit", nil, true},
	} {
		tp, err := rules.ParseTemplate(tc.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.CanRender(tc.prefix, tc.key, tc.accept); got != tc.want {
			t.Errorf("%q%q renders %q: %v, want %v", tc.prefix, tc.tmpl, tc.key, got, tc.want)
		}
	}
}

// TestNewRuleSetPrefixMarks: rules built in Go are held to the same
// prefix rule as rule files.
func TestNewRuleSetPrefixMarks(t *testing.T) {
	key, _ := rules.ParseTemplate("k:{id}")
	for prefix, ok := range map[string]bool{"app:": true, "app%3A": true, "app%": false, "app%copy": false, "a b": false} {
		_, err := rules.NewRuleSet([]*rules.Rule{{Name: "r", Kind: rules.BumpRule, Table: "t", Key: key, Prefix: prefix}})
		if (err == nil) != ok || err != nil && !strings.Contains(err.Error(), "prefix") {
			t.Errorf("prefix %q: %v, want ok=%v", prefix, err, ok)
		}
	}
}

// TestForgedGenerationKeys: a template whose literal text reads like a
// generation item's key, or a counter's key under a generation, renders
// keys of its own for every value, so no rule can write into a table's
// generation or into another row's counter.
func TestForgedGenerationKeys(t *testing.T) {
	gen := rules.GenerationKey("p:", "shop", "users")
	for _, tc := range []struct{ tmpl, value, target string }{
		{"gen:{v}", "shop.users", gen},
		{"{v}", strings.TrimPrefix(gen, "p:"), gen},
		{"comments:{v}", "9%@1782579200000000005", "p:comments:9%@1782579200000000005"},
		{"comments:{v}", "9@1782579200000000005", "p:comments:9%@1782579200000000005"},
	} {
		if got := mustKey(t, "p:", tc.tmpl, map[string]string{"v": tc.value}); got == tc.target {
			t.Errorf("template %q with %q renders %q", tc.tmpl, tc.value, got)
		}
	}
	if _, err := rules.ParseTemplate("%gen:{t}"); err == nil {
		t.Errorf("a template may spell the generation mark")
	}
}
