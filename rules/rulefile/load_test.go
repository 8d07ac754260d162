package rulefile

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

func loadFixture(t testing.TB, path string) *rules.RuleSet {
	t.Helper()
	rs, err := LoadPaths(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return rs
}

func ruleNames(rs *rules.RuleSet) []string {
	var names []string
	for _, r := range rs.Rules() {
		names = append(names, r.Name)
	}
	return names
}

func TestLoadGoodFile(t *testing.T) {
	rs := loadFixture(t, "testdata/good/shop.yaml")
	if got, want := ruleNames(rs), []string{"user-profile", "user-interests", "post-comments", "all-users"}; !slices.Equal(got, want) {
		t.Fatalf("rules = %q, want %q", got, want)
	}
	std := []rules.Operation{rules.Insert, rules.Update, rules.Delete}

	p := rs.Rule("user-profile")
	if p.Kind != rules.BumpRule || p.Prefix != "shop:" || p.Database != "shop" || p.Table != "users" ||
		p.Key.String() != "ns:user:{id}" || !slices.Equal(p.Columns, []string{"name", "email"}) ||
		p.RebumpAfter != 5*time.Second || p.TTL != 0 || p.Query != "" || p.Args != nil || !slices.Equal(p.On, std) ||
		p.File != "testdata/good/shop.yaml" || p.Line != 4 || p.Column != 5 {
		t.Errorf("user-profile = %+v", *p)
	}

	s := rs.Rule("user-interests")
	if s.Kind != rules.SetRule || s.Key.String() != "interests:{user_id}" || s.Member.String() != "{interest_id}" ||
		s.When != "active == 1" || !strings.HasPrefix(s.Query, "SELECT interest_id") ||
		!slices.Equal(s.Args, []string{"user_id"}) || !slices.Equal(s.On, std) {
		t.Errorf("user-interests = %+v", *s)
	}

	c := rs.Rule("post-comments")
	if c.Kind != rules.CountRule || c.Key.String() != "comments:{post_id}" || c.Database != "blog" ||
		!slices.Equal(c.Args, []string{"post_id"}) || c.TTL != 0 || c.Member != nil {
		t.Errorf("post-comments = %+v (args default to the key's columns)", *c)
	}

	a := rs.Rule("all-users")
	if a.Database != "" || a.Table != "users" || a.TTL != time.Hour ||
		!slices.Equal(a.On, []rules.Operation{rules.Insert, rules.Delete, rules.Truncate, rules.Read}) {
		t.Errorf("all-users = %+v", *a)
	}
	for op, want := range map[rules.Operation]bool{rules.Insert: true, rules.Update: false, rules.Delete: true, rules.Read: true, rules.Truncate: true} {
		if a.Handles(op) != want {
			t.Errorf("all-users.Handles(%s) = %v, want %v", op, !want, want)
		}
	}
	if !a.Matches("any", "users") || a.Matches("any", "Users") || !p.Matches("shop", "users") || p.Matches("other", "users") {
		t.Errorf("Matches is wrong")
	}
}

// A YAML 1.1 reader would turn the key `on` into the boolean true; ours
// must keep it a field name, quoted or not.
func TestOnKeyStaysAString(t *testing.T) {
	for _, key := range []string{"on", `"on"`, "'on'"} {
		rs, err := Parse("t.yaml", []byte("version: 1\nrules:\n  - name: r\n    table: t\n    bump: k\n    "+key+": [read]\n"))
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if r := rs.Rules()[0]; !slices.Equal(r.On, []rules.Operation{rules.Read}) {
			t.Errorf("%s: On = %v, want [read]", key, r.On)
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	rs := loadFixture(t, "testdata/dir")
	if got, want := ruleNames(rs), []string{"first-a", "first-b", "second"}; !slices.Equal(got, want) {
		t.Fatalf("rules = %q, want %q (name order; hidden, non-YAML files and directories skipped)", got, want)
	}
	if rs.Rule("first-a").Prefix != "a:" || rs.Rule("second").Prefix != "" {
		t.Errorf("prefixes are per file")
	}

	rs, err := LoadPaths("testdata/dir/20-second.yml", "testdata/dir/10-first.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ruleNames(rs), []string{"second", "first-a", "first-b"}; !slices.Equal(got, want) {
		t.Errorf("rules = %q, want %q (path order)", got, want)
	}
}

func problemLines(t *testing.T, err error) []string {
	t.Helper()
	var le *rules.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v (%T), want *LoadError", err, err)
	}
	if got := strings.Join(func() []string {
		var s []string
		for _, p := range le.Problems {
			s = append(s, p.String())
		}
		return s
	}(), "\n"); got != le.Error() {
		t.Errorf("Error() is not one problem per line:\n%s", le.Error())
	}
	return strings.Split(le.Error(), "\n")
}

func TestLoadReportsEveryProblem(t *testing.T) {
	_, err := LoadPaths("testdata/bad/many.yaml")
	const f = "testdata/bad/many.yaml:"
	want := []string{
		f + `1:10: unsupported version "2" (want 1)`,
		f + `2:9: prefix "shop: ": byte 0x20 at 5 is not allowed in a memcached key`,
		f + `6:11: bump: template "ns:user:{id": unclosed '{' at byte 8`,
		f + `7:11: duplicate rule name "user-profile" (first defined at testdata/bad/many.yaml:4:11)`,
		f + `10:5: rule: unknown key "colour" (known: name, table, on, when, columns, bump, set, count, ttl, rebump_after, copies, evidence, collation)`,
		f + `13:27: when: unexpected token EOF`,
		f + `16:16: recount has 2 '?' placeholder(s) but the key's placeholders (default args) name 1 column(s)`,
		f + `17:18: unknown operation "upsert" in on (want insert, update, delete, read or truncate)`,
		f + `17:26: truncate is allowed only in bump rules`,
		f + `21:5: rule "two-kinds" has both bump and set; a rule has exactly one`,
		f + `22:19: rebump_after "soon": want seconds or a duration such as 30s, 5m, 1h`,
		f + `23:5: rule "no-kind" needs one of bump, set or count`,
		f + `25:10: ttl must be seconds (an integer) or a duration such as 30s, 5m, 1h, not a number`,
		f + `26:37: when: builtin len() is not supported as a value in when; use a column or a literal`,
		f + `29:5: columns is allowed only in bump rules`,
		f + `33:7: args given without load`,
	}
	if got := problemLines(t, err); !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestLoadAcrossFiles(t *testing.T) {
	_, err := LoadPaths("testdata/bad/dup_a.yaml", "testdata/bad/dup_b.yaml", "testdata/missing.yaml", "testdata/bad/syntax.yaml")
	want := []string{
		`testdata/missing.yaml: no such file or directory`,
		`testdata/bad/dup_b.yaml:6:11: duplicate rule name "same" (first defined at testdata/bad/dup_a.yaml:3:11)`,
		`testdata/bad/syntax.yaml:4:12: YAML: did not find expected ',' or ']'`,
	}
	if got := problemLines(t, err); !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := LoadPaths(); err == nil {
		t.Errorf("LoadPaths() with no path loaded")
	}
	if _, err := LoadPaths("testdata/good/"); err != nil {
		t.Errorf("a directory: %v", err)
	}
	empty := t.TempDir()
	_, err = LoadPaths(empty)
	if got := problemLines(t, err); !slices.Equal(got, []string{empty + ": directory has no *.yaml or *.yml rule file"}) {
		t.Errorf("empty directory: %q", got)
	}
}

func TestParseFilesCombines(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("version: 1\nprefix: 'a:'\nrules:\n  - {name: x, table: t, bump: k}\n")}
	b := File{Name: "b.yaml", Data: []byte("version: 1\nrules:\n  - {name: y, table: t, bump: k}\n")}
	rs, err := ParseFiles(a, b)
	if err != nil {
		t.Fatal(err)
	}
	ops, _, err := rs.Plan(nil, &rules.Event{Table: "t", Operation: rules.Truncate})
	if err != nil || len(ops) != 0 {
		t.Fatalf("truncate without truncate in on: ops %v err %v", ops, err)
	}
	ops, _, err = rs.Plan(nil, &rules.Event{Table: "t", Operation: rules.Insert, After: rules.Row{}})
	if err != nil || len(ops) != 2 || ops[0].Key != "a:k" || ops[1].Key != "k" {
		t.Fatalf("ops = %+v, err = %v", ops, err)
	}
	_, err = ParseFiles(a, File{Name: "c.yaml", Data: a.Data})
	if got := problemLines(t, err); len(got) != 1 || !strings.HasPrefix(got[0], `c.yaml:4:12: duplicate rule name "x" (first defined at a.yaml:4:12)`) {
		t.Errorf("problems = %q", got)
	}
}

// TestParseProblems checks one mistake at a time: the exact problem and
// its position.
// markRule ends the message of a '%' that does not start an escape.
const markRule = " with two upper-case hex digits: a '%' followed by anything else is reserved for the daemon's key marks (write %25 for a '%')"

func TestParseProblems(t *testing.T) {
	const head = "version: 1\nrules:\n  - name: r\n    table: t\n"
	tests := []struct {
		name, src, want string
	}{
		{"empty file", "", "t.yaml: rule file is empty (0 bytes, no text): want version: 1 and a rules list (a file of comments alone may stand for no rules yet)"},
		{"blank file", "\n  \n", "t.yaml: rule file is empty (4 bytes, no text): want version: 1 and a rules list (a file of comments alone may stand for no rules yet)"},
		{"an empty rules list is a choice", "version: 1\nrules: []\n", ""},
		{"comments only", "# nothing yet\n", ""},
		{"missing version", "rules: []\n", `t.yaml:1:1: missing required key "version" (want version: 1)`},
		{"version as string", "version: '1'\nrules: []\n", `t.yaml:1:10: unsupported version "1" (want 1)`},
		{"missing rules", "version: 1\n", `t.yaml:1:1: missing required key "rules"`},
		{"rules not a list", "version: 1\nrules: {}\n", "t.yaml:2:8: rules must be a list, not a mapping"},
		{"top level not a mapping", "- a\n", "t.yaml:1:1: the top level must be a mapping, not a list"},
		{"unknown top-level field", "version: 1\nrules: []\nprefx: a\n", `t.yaml:3:1: unknown key "prefx" (known: version, prefix, fallback, rules)`},
		{"fallback with a column", "version: 1\nfallback: 'fb:{id}'\nrules: []\n", `t.yaml:2:11: fallback: placeholder {id}: only {db} and {table} are known (the rule's table)`},
		{"fallback db for any database", "version: 1\nfallback: 'fb:{db}.{table}'\nrules:\n  - name: r\n    table: t\n    bump: k\n",
			`t.yaml:2:11: fallback: {db} is unknown for rule "r", whose table "t" names no database`},
		{"repeated field", "version: 1\nversion: 1\nrules: []\n", `t.yaml:2:1: duplicate key "version" (first at line 1)`},
		{"two documents", "version: 1\nrules: []\n---\nversion: 1\n", "t.yaml:3:1: only one YAML document is allowed"},
		{"prefix control byte", "version: 1\nprefix: \"a\\tb\"\nrules: []\n", `t.yaml:2:9: prefix "a\tb": byte 0x09 at 1 is not allowed in a memcached key`},
		// '%' followed by anything but two upper-case hex digits starts the
		// daemon's key marks ("%#", "%copy", "%fence", "%rebump:"), which no
		// rule file may spell.
		{"prefix with a mark", "version: 1\nprefix: 'a%copy'\nrules: []\n", `t.yaml:2:9: prefix "a%copy": '%' at 1 must start %XX` + markRule},
		{"prefix ending in %", "version: 1\nprefix: 'a%'\nrules: []\n", `t.yaml:2:9: prefix "a%": '%' at 1 must start %XX` + markRule},
		{"template spelling a fence", head + "    count: {key: 'c:{id}%fence'}\n", `t.yaml:5:18: count key: template "c:{id}%fence": '%' at 6 must start %XX` + markRule},
		{"% before a placeholder", head + "    bump: 'k%{id}'\n", `t.yaml:5:11: bump: template "k%{id}": '%' at 1 must start %XX` + markRule},
		{"lower-case escape", head + "    bump: 'k:%2f{id}'\n", `t.yaml:5:11: bump: template "k:%2f{id}": '%' at 2 must start %XX` + markRule},
		{"hashed-key mark in a master", head + "    bump: 'k:{id}'\n    evidence: {master: 'm%#'}\n", `t.yaml:6:24: evidence master: template "m%#": '%' at 1 must start %XX` + markRule},
		{"rule not a mapping", "version: 1\nrules:\n  - r\n", "t.yaml:3:5: rule must be a mapping, not a string"},
		{"no name", "version: 1\nrules:\n  - table: t\n    bump: k\n", `t.yaml:3:5: rule: missing required key "name"`},
		{"name with space", "version: 1\nrules:\n  - name: a b\n    table: t\n    bump: k\n", `t.yaml:3:11: rule name "a b" must not contain spaces or control characters`},
		{"empty name", "version: 1\nrules:\n  - name: ''\n    table: t\n    bump: k\n", `t.yaml:3:11: name must not be empty`},
		{"no table", "version: 1\nrules:\n  - name: r\n    bump: k\n", `t.yaml:3:5: rule "r": missing required key "table"`},
		{"bad table", "version: 1\nrules:\n  - name: r\n    table: .t\n    bump: k\n", `t.yaml:4:12: table ".t": want db.table or table`},
		{"table a list", "version: 1\nrules:\n  - name: r\n    table: [t]\n    bump: k\n", `t.yaml:4:12: table must be a string, not a list`},
		{"no kind", head, `t.yaml:3:5: rule "r" needs one of bump, set or count`},
		{"three kinds", head + "    bump: k\n    count: {key: c}\n    set: {key: s, member: m}\n",
			"t.yaml:6:5: rule \"r\" has both bump and count; a rule has exactly one\nt.yaml:7:5: rule \"r\" has both bump and set; a rule has exactly one"},
		{"bad template", head + "    bump: 'a}b'\n", `t.yaml:5:11: bump: template "a}b": '}' without '{' at byte 1`},
		{"template with space", head + "    bump: 'a b'\n", `t.yaml:5:11: bump: template "a b": byte 0x20 at 1 is not allowed in a memcached key`},
		{"empty placeholder", head + "    bump: 'a{}'\n", `t.yaml:5:11: bump: template "a{}": empty placeholder at byte 1`},
		{"set not a mapping", head + "    set: k\n", `t.yaml:5:10: set must be a mapping, not a string`},
		{"set without member", head + "    set:\n      key: k\n", `t.yaml:6:7: set: missing required key "member"`},
		{"count without key", head + "    count:\n      recount: SELECT 1\n", "t.yaml:6:7: count: missing required key \"key\"\n"},
		{"unknown set field", head + "    set:\n      key: k\n      member: m\n      ttl: 5\n", `t.yaml:8:7: set: unknown key "ttl" (known: key, member, load, args, keys)`},
		{"count with member", head + "    count:\n      key: k\n      member: m\n", `t.yaml:7:7: count: unknown key "member" (known: key, recount, args, keys)`},
		{"load placeholders vs args", head + "    set:\n      key: 's:{a}'\n      member: '{m}'\n      load: SELECT m FROM t WHERE a = ? AND b = ?\n      args: [a]\n",
			`t.yaml:8:13: load has 2 '?' placeholder(s) but args name 1 column(s)`},
		{"placeholders in quotes and comments do not count", head + "    count:\n      key: 'c:{a}'\n      recount: \"SELECT COUNT(*) FROM t WHERE a = ? AND b <> '?' -- ?\"\n", ""},
		{"args may name a column twice", head + "    count:\n      key: 'c:{a}'\n      recount: SELECT COUNT(*) FROM t WHERE a = ? OR b = ?\n      args: [a, a]\n", ""},
		{"columns twice", head + "    bump: k\n    columns: [a, a]\n", `t.yaml:6:18: column "a" listed twice in columns`},
		{"args empty", head + "    count:\n      key: 'c:{a}'\n      recount: SELECT 1\n      args: []\n", `t.yaml:8:13: args must list at least one column`},
		{"args without recount", head + "    count:\n      key: 'c:{a}'\n      args: [a]\n", `t.yaml:7:7: args given without recount`},
		{"on not a list", head + "    bump: k\n    on: insert\n", `t.yaml:6:9: on must be a list such as [insert, update, delete], not a string`},
		{"on empty", head + "    bump: k\n    on: []\n", `t.yaml:6:9: on must list at least one operation`},
		{"on twice", head + "    bump: k\n    on: [insert, insert]\n", `t.yaml:6:18: operation "insert" listed twice in on`},
		{"on upper case", head + "    bump: k\n    on: [INSERT]\n", `t.yaml:6:10: unknown operation "INSERT" in on (want insert, update, delete, read or truncate)`},
		{"truncate with placeholders", head + "    bump: 'k:{id}'\n    on: [truncate]\n", `t.yaml:6:10: truncate needs a bump key without placeholders; "k:{id}" has some`},
		{"truncate in a set rule", head + "    set: {key: s, member: m}\n    on: [truncate]\n", `t.yaml:6:10: truncate is allowed only in bump rules`},
		{"truncate with a literal key", head + "    bump: k\n    on: [truncate]\n", ""},
		{"columns in a count rule", head + "    count: {key: c}\n    columns: [a]\n", `t.yaml:6:5: columns is allowed only in bump rules`},
		{"columns empty", head + "    bump: k\n    columns: []\n", `t.yaml:6:14: columns must list at least one column`},
		{"columns bad name", head + "    bump: k\n    columns: ['a b']\n", `t.yaml:6:15: bad column name "a b" in columns`},
		{"rebump_after in a set rule", head + "    set: {key: s, member: m}\n    rebump_after: 5s\n", `t.yaml:6:5: rebump_after is allowed only in bump rules`},
		{"rebump_after negative", head + "    bump: k\n    rebump_after: -5s\n", `t.yaml:6:19: rebump_after must not be negative`},
		{"ttl negative", head + "    bump: k\n    ttl: -1\n", `t.yaml:6:10: ttl "-1" is not a usable number of seconds`},
		{"ttl fraction", head + "    bump: k\n    ttl: 1500ms\n", `t.yaml:6:10: ttl must be whole seconds`},
		{"ttl over 30 days", head + "    bump: k\n    ttl: 2592001\n", `t.yaml:6:10: ttl 720h0m1s exceeds 30 days, which memcached would read as a Unix time`},
		{"ttl bad unit", head + "    bump: k\n    ttl: 5 minutes\n", `t.yaml:6:10: ttl "5 minutes": want seconds or a duration such as 30s, 5m, 1h`},
		{"when syntax", head + "    bump: k\n    when: 'a == == 1'\n", `t.yaml:6:17: when: unexpected token Operator("==")`},
		{"when plain scalar", head + "    bump: k\n    when: a + 1 > 2\n", `t.yaml:6:13: when: operator "+" is not supported as a value in when; use a column or a literal`},
		{"when function", head + "    bump: k\n    when: \"lower(name) == 'x'\"\n", `t.yaml:6:12: when: builtin lower() is not supported as a value in when; use a column or a literal`},
		{"when not boolean", head + "    bump: k\n    when: \"'yes'\"\n", `t.yaml:6:12: when: a literal is not a condition; compare a column with it: x == 1`},
		{"when member access", head + "    bump: k\n    when: 'a.b == 1'\n", `t.yaml:6:14: when: member access is not supported as a value in when; use a column or a literal`},
		{"when in without list", head + "    bump: k\n    when: 'a in b'\n", `t.yaml:6:17: when: in needs a list literal: x in [1, 2]`},
		{"when bad regexp", head + "    bump: k\n    when: 'a matches \"(\"'\n", "t.yaml:6:22: when: bad regular expression: error parsing regexp: missing closing ): `(`"},
		{"when literal block", head + "    bump: k\n    when: |\n      a == 1 &&\n        b ** 2\n", `t.yaml:8:11: when: operator "**" is not supported in when`},
		{"when folded block", head + "    bump: k\n    when: >\n      a == 1 &&\n      b ** 2\n", `t.yaml:6:11: when: operator "**" is not supported in when (line 1, column 13 of the expression)`},
		{"when with escapes before the error", head + "    bump: k\n    when: \"a == \\\"x\\\" || b ** 2\"\n", `t.yaml:6:11: when: operator "**" is not supported in when (line 1, column 15 of the expression)`},
		{"collation accepted", head + "    bump: 'k:{a}'\n    collation: accept-folding\n", ""},
		{"collation unknown value", head + "    bump: k\n    collation: utf8mb4_bin\n", `t.yaml:6:16: collation "utf8mb4_bin": want "accept-folding" (the only value; leave collation out to have folding collations reported)`},
		{"collation a list", head + "    bump: k\n    collation: [accept-folding]\n", `t.yaml:6:16: collation must be a string, not a list`},
		{"collation in a set mapping", head + "    set: {key: s, member: m, collation: accept-folding}\n", `t.yaml:5:30: set: unknown key "collation" (known: key, member, load, args, keys)`},
		{"alias of a rule", "version: 1\nrules:\n  - &r {name: a, table: t, bump: k}\n  - *r\n", `t.yaml:3:15: duplicate rule name "a" (first defined at t.yaml:3:15)`},
		{"merge key", head + "    bump: k\n    <<: {ttl: 5}\n", `t.yaml:6:5: rule: merge keys (<<) are not supported; write the keys out`},
		{"unknown anchor", head + "    bump: *nope\n", `t.yaml:5:11: YAML: unknown anchor 'nope' referenced`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Parse("t.yaml", []byte(tc.src))
			want := strings.TrimSuffix(tc.want, "\n")
			if want == "" {
				if err != nil {
					t.Fatalf("unexpected problems:\n%v", err)
				}
				if rs == nil {
					t.Fatal("nil RuleSet without error")
				}
				return
			}
			if rs != nil {
				t.Errorf("got a RuleSet along with problems")
			}
			if got := strings.Join(problemLines(t, err), "\n"); got != want {
				t.Errorf("problems:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestCollationOption loads a rule's collation: accept-folding.
func TestCollationOption(t *testing.T) {
	rs, err := Parse("t.yaml", []byte("version: 1\nrules:\n  - {name: a, table: t, bump: 'k:{x}', collation: accept-folding}\n  - {name: b, table: t, bump: 'k:{x}'}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Rule("a").AcceptFolding || rs.Rule("b").AcceptFolding {
		t.Errorf("AcceptFolding: a %v (want true), b %v (want false)", rs.Rule("a").AcceptFolding, rs.Rule("b").AcceptFolding)
	}
	if at := rs.Rule("a").At["collation"]; at != (rules.Location{Line: 3, Column: 51}) {
		t.Errorf("collation located at %+v", at)
	}
}

func TestDurations(t *testing.T) {
	tests := []struct {
		ttl, rebump       string
		wantTTL, wantBump time.Duration
	}{
		{"0", "0", 0, 0},
		{"300", "2", 5 * time.Minute, 2 * time.Second},
		{"5m", "500ms", 5 * time.Minute, 500 * time.Millisecond},
		{"1h30m", "1m", 90 * time.Minute, time.Minute},
		{"2592000", "10s", rules.MaxTTL, 10 * time.Second},
		{"'60'", "'5s'", 0, 0}, // a quoted number is not a duration
	}
	for _, tc := range tests {
		src := "version: 1\nrules:\n  - name: r\n    table: t\n    bump: k\n    ttl: " + tc.ttl + "\n    rebump_after: " + tc.rebump + "\n"
		rs, err := Parse("t.yaml", []byte(src))
		if tc.ttl == "'60'" {
			if err == nil || !strings.Contains(err.Error(), `ttl "60": want seconds`) {
				t.Errorf("quoted ttl: err = %v", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ttl %s: %v", tc.ttl, err)
			continue
		}
		r := rs.Rules()[0]
		if r.TTL != tc.wantTTL || r.RebumpAfter != tc.wantBump {
			t.Errorf("ttl %s rebump_after %s: got %v, %v", tc.ttl, tc.rebump, r.TTL, r.RebumpAfter)
		}
	}
}

// TestLoadHotKeysAndEvidence loads copies and evidence and reports their
// mistakes at their positions.
func TestLoadHotKeysAndEvidence(t *testing.T) {
	rs, err := Parse("hot.yaml", []byte(`version: 1
prefix: "p:"
rules:
  - {name: catalog, table: products, on: [truncate, insert], bump: "ns:catalog", copies: 8}
  - name: user
    table: users
    bump: "ns:user:{id}"
    evidence: {master: "ns:user:master", bits: 128}
  - name: post
    table: posts
    bump: "ns:post:{id}"
    evidence: {master: "ns:post:master", max_set: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c := rs.Rule("catalog"); c.Copies != 8 || c.Evidence != nil {
		t.Errorf("catalog = %+v", *c)
	}
	if ev := rs.Rule("user").Evidence; ev == nil || ev.Bits != 128 || ev.MaxSet != 32 || ev.MasterKey != "p:ns:user:master" || ev.Column != "id" {
		t.Errorf("user evidence = %+v", ev)
	}
	if ev := rs.Rule("post").Evidence; ev == nil || ev.Bits != 64 || ev.MaxSet != 3 {
		t.Errorf("post evidence = %+v", ev)
	}

	_, err = Parse("bad.yaml", []byte(`version: 1
rules:
  - {name: a, table: t, bump: "k:{id}", copies: 1}
  - {name: b, table: t, set: {key: "k:{id}", member: "{m}"}, copies: 4}
  - {name: c, table: t, bump: "k:{id}", copies: 4, evidence: {master: m}}
  - {name: d, table: t, bump: "k:{id}:{x}", evidence: {master: m}}
  - {name: e, table: t, bump: "k:{id}", evidence: {master: "m:{id}", bits: 12}}
  - {name: f, table: t, bump: "k:{id}", evidence: {bits: 8, max_set: 9, other: 1}}
  - {name: g, table: t, bump: "k:{id}", copies: "4"}
`))
	want := []string{
		"bad.yaml:3:49: copies 1: want an integer from 2 to 64",
		"bad.yaml:4:62: copies is allowed only in bump rules",
		"bad.yaml:5:52: a rule has copies or evidence, not both",
		"bad.yaml:6:55: evidence needs a bump key with one placeholder column, the entity id; \"k:{id}:{x}\" has 2",
		"bad.yaml:7:60: evidence master \"m:{id}\" must not have placeholders: one master serves every entity",
		"bad.yaml:7:76: evidence bits 12 must be a multiple of 8",
		`bad.yaml:8:51: evidence: missing required key "master"`,
		"bad.yaml:8:70: evidence max_set 9: want an integer from 1 to 8",
		`bad.yaml:8:73: evidence: unknown key "other" (known: master, bits, max_set)`,
		"bad.yaml:9:49: copies must be an integer, not a string",
	}
	if got := problemLines(t, err); !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestArgsRepeatAColumn binds a column that args names twice to both of
// the query's placeholders.
func TestArgsRepeatAColumn(t *testing.T) {
	rs, err := Parse("t.yaml", []byte("version: 1\nrules:\n  - name: r\n    table: t\n    count:\n      key: 'c:{a}'\n"+
		"      recount: SELECT COUNT(*) FROM t WHERE a = ? OR b = ?\n      args: [a, a]\n"))
	if err != nil {
		t.Fatal(err)
	}
	seven := rules.Value{Kind: rules.KindInt, Text: "7"}
	ops, _, err := rs.Plan(nil, &rules.Event{Table: "t", Operation: rules.Update, After: rules.Row{{Name: "a", Value: seven}}})
	if err != nil || len(ops) != 1 || ops[0].Kind != rules.OpRecount || !slices.Equal(ops[0].Args, []rules.Value{seven, seven}) {
		t.Fatalf("ops = %+v, err = %v", ops, err)
	}
}
