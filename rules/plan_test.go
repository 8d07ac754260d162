package rules_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// row is the package's own test helper (rowfixture_test.go).
var row = rules.RowFixture

// opString renders an op compactly for comparisons:
// "rule kind key [member] [delta] [args=a,b]".
func opString(op rules.Op) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", op.Rule.Name, op.Kind, op.Key)
	switch op.Kind {
	case rules.OpSetAdd, rules.OpSetRemove:
		fmt.Fprintf(&b, " %s", op.Member)
	case rules.OpCount:
		fmt.Fprintf(&b, " %+d", op.Delta)
	}
	if op.Legacy {
		b.WriteString(" legacy")
	}
	if op.Args != nil {
		texts := make([]string, len(op.Args))
		for i, a := range op.Args {
			texts[i] = a.Kind.String() + ":" + a.Text
		}
		fmt.Fprintf(&b, " args=%s", strings.Join(texts, ","))
	}
	return b.String()
}

func loadFixture(t testing.TB, path string) *rules.RuleSet {
	t.Helper()
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return rs
}

func TestPlan(t *testing.T) {
	rs := loadFixture(t, "testdata/plan.yaml")
	long := strings.Repeat("x", 300)
	tests := []struct {
		name      string
		ev        rules.Event
		want      []string
		wantStats rules.PlanStats
	}{
		// bump rules
		{
			name: "insert bumps every matching rule in rule order",
			ev:   rules.Event{Database: "shop", Table: "users", Operation: rules.Insert, After: row("id=42", "name='ann'", "email='a@x'", "active=1", "org_id=7")},
			want: []string{
				"profile bump p:ns:user:42",
				"users-any-db bump p:ns:users",
				"by-org bump p:ns:org:7",
			},
			wantStats: rules.PlanStats{Rules: 3},
		},
		{
			name: "update with a listed column changed bumps the key once",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name='ann'", "email='a@x'", "active=1", "org_id=7"),
				After:  row("id=42", "name='anne'", "email='a@x'", "active=1", "org_id=7")},
			want: []string{
				"profile bump p:ns:user:42",
				"by-org bump p:ns:org:7",
			},
			wantStats: rules.PlanStats{Rules: 2},
		},
		{
			name: "update with listed columns unchanged skips the columns rule only",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name='ann'", "email='a@x'", "active=1", "org_id=7", "age=30"),
				After:  row("id=42", "name='ann'", "email='a@x'", "active=1", "org_id=7", "age=31")},
			want:      []string{"by-org bump p:ns:org:7"},
			wantStats: rules.PlanStats{Rules: 2, Unchanged: 1},
		},
		{
			name: "columns compare numbers numerically across encodings",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name=1", "email='a'", "active=0", "org_id=7"),
				After:  row("id=42", "name=1.0", "email='a'", "active=0", "org_id=7")},
			want:      nil,
			wantStats: rules.PlanStats{Rules: 2, Unchanged: 1},
		},
		{
			name: "columns: null to value is a change",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name=null", "email='a'", "active=0", "org_id=7"),
				After:  row("id=42", "name='b'", "email='a'", "active=0", "org_id=7")},
			want:      []string{"profile bump p:ns:user:42"},
			wantStats: rules.PlanStats{Rules: 2},
		},
		{
			name: "update moving a row between keys bumps both, before first",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name='a'", "email='a'", "active=1", "org_id=7"),
				After:  row("id=43", "name='a'", "email='a'", "active=1", "org_id=8")},
			// The key column changed: it counts as listed, so the
			// profile rule bumps both keys although name and email kept
			// their values.
			want: []string{
				"profile bump p:ns:user:42",
				"profile bump p:ns:user:43",
				"by-org bump p:ns:org:7",
				"by-org bump p:ns:org:8",
			},
			wantStats: rules.PlanStats{Rules: 2},
		},
		{
			name: "predicate turning false bumps only the before key",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name='a'", "email='a'", "active=1", "org_id=7"),
				After:  row("id=42", "name='a'", "email='a'", "active=0", "org_id=8")},
			want:      []string{"by-org bump p:ns:org:7"},
			wantStats: rules.PlanStats{Rules: 2, Unchanged: 1},
		},
		{
			name: "predicate turning true bumps only the after key",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=42", "name='a'", "email='a'", "active=0", "org_id=7"),
				After:  row("id=42", "name='a'", "email='a'", "active=1", "org_id=8")},
			want:      []string{"by-org bump p:ns:org:8"},
			wantStats: rules.PlanStats{Rules: 2, Unchanged: 1},
		},
		{
			name: "update without before image bumps key(after) whatever when and columns say",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				After: row("id=42", "name='a'", "email='a'", "active=0", "org_id=8")},
			want: []string{
				"profile bump p:ns:user:42",
				"by-org bump p:ns:org:8",
			},
			wantStats: rules.PlanStats{Rules: 2},
		},
		{
			name: "delete bumps key(before)",
			ev:   rules.Event{Database: "shop", Table: "users", Operation: rules.Delete, Before: row("id=42", "name='a'", "email='a'", "active=1", "org_id=7")},
			want: []string{
				"profile bump p:ns:user:42",
				"users-any-db bump p:ns:users",
				"by-org bump p:ns:org:7",
			},
			wantStats: rules.PlanStats{Rules: 3},
		},
		{
			name:      "read is planned only by rules listing read",
			ev:        rules.Event{Database: "shop", Table: "users", Operation: rules.Read, After: row("id=42", "active=1", "org_id=7")},
			want:      []string{"users-any-db bump p:ns:users"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "truncate bumps placeholder-free keys of rules listing it",
			ev:        rules.Event{Database: "shop", Table: "users", Operation: rules.Truncate},
			want:      []string{"users-any-db bump p:ns:users"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "truncate of a table with set and count rules bumps its generation once",
			ev:   rules.Event{Database: "blog", Table: "comments", Operation: rules.Truncate},
			want: []string{"generation bump p:%gen:blog.comments"},
		},
		{
			name: "table without rules plans nothing",
			ev:   rules.Event{Database: "shop", Table: "orders", Operation: rules.Insert, After: row("id=1")},
		},
		{
			name:      "db.table rules match only their database; table rules any",
			ev:        rules.Event{Database: "other", Table: "users", Operation: rules.Insert, After: row("id=5")},
			want:      []string{"users-any-db bump p:ns:users", "other-users bump p:ns:other:5"},
			wantStats: rules.PlanStats{Rules: 2},
		},
		{
			name:      "a null placeholder gives no key and is counted",
			ev:        rules.Event{Database: "shop", Table: "users", Operation: rules.Insert, After: row("id=null", "active=1", "org_id=null")},
			want:      []string{"users-any-db bump p:ns:users"},
			wantStats: rules.PlanStats{Rules: 3, NullKeys: 2},
		},
		{
			name:      "a predicate column missing from the row is null",
			ev:        rules.Event{Database: "shop", Table: "users", Operation: rules.Insert, After: row("id=1", "org_id=2")},
			want:      []string{"profile bump p:ns:user:1", "users-any-db bump p:ns:users"},
			wantStats: rules.PlanStats{Rules: 3},
		},
		{
			name:      "a 2^64 id keeps its digits",
			ev:        rules.Event{Database: "other", Table: "users", Operation: rules.Insert, After: row("id=18446744073709551616")},
			want:      []string{"users-any-db bump p:ns:users", "other-users bump p:ns:other:18446744073709551616"},
			wantStats: rules.PlanStats{Rules: 2},
		},

		// set rules
		{
			name:      "set insert holding when adds, args from the after image",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Insert, After: row("user_id=5", "interest_id=9", "active=1")},
			want:      []string{"interests set_add p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "set insert failing when plans nothing",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Insert, After: row("user_id=5", "interest_id=9", "active=0")},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "set update entering the predicate adds",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=9", "active=0"), After: row("user_id=5", "interest_id=9", "active=1")},
			want:      []string{"interests set_add p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "set update leaving the predicate removes",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=9", "active=true"), After: row("user_id=5", "interest_id=9", "active=false")},
			want:      []string{"interests set_remove p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "set update moving the row: remove from the old set, add to the new",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=9", "active=1"), After: row("user_id=6", "interest_id=9", "active=1")},
			want: []string{
				"interests set_remove p:interests:5 9 args=int:5",
				"interests set_add p:interests:6 9 args=int:6",
			},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "set update changing the member in one set",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=9", "active=1"), After: row("user_id=5", "interest_id=10", "active=1")},
			want: []string{
				"interests set_remove p:interests:5 9 args=int:5",
				"interests set_add p:interests:5 10 args=int:5",
			},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "set update keeping the membership plans nothing",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=9", "active=1", "note='a'"), After: row("user_id=5", "interest_id=9", "active=1", "note='b'")},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "set update without before image, when holds: add",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update, After: row("user_id=5", "interest_id=9", "active=1")},
			want:      []string{"interests set_add p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "set update without before image, when fails: remove m(after)",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update, After: row("user_id=5", "interest_id=9", "active=0")},
			want:      []string{"interests set_remove p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "set delete removes",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Delete, Before: row("user_id=5", "interest_id=9", "active=1")},
			want:      []string{"interests set_remove p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "set read is ignored without read in on",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Read, After: row("user_id=5", "interest_id=9", "active=1")},
			wantStats: rules.PlanStats{},
		},
		{
			name:      "set member null gives no membership",
			ev:        rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Insert, After: row("user_id=5", "interest_id=null", "active=1")},
			wantStats: rules.PlanStats{Rules: 1, NullKeys: 1},
		},
		{
			name: "set with a null before member: only the add",
			ev: rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Update,
				Before: row("user_id=5", "interest_id=null", "active=1"), After: row("user_id=5", "interest_id=9", "active=1")},
			want:      []string{"interests set_add p:interests:5 9 args=int:5"},
			wantStats: rules.PlanStats{Rules: 1, NullKeys: 1},
		},
		{
			name:      "set without load: no args; members and keys escaped",
			ev:        rules.Event{Database: "blog", Table: "tags", Operation: rules.Insert, After: row("post_id='a b'", "tag='50% off\n'")},
			want:      []string{"tags set_add p:tags:a%20b 50%25%20off%0A"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "long keys are hashed",
			ev:   rules.Event{Database: "blog", Table: "tags", Operation: rules.Insert, After: row("post_id='"+long+"'", "tag='t'")},
			// and the key earlier releases hashed it to is deleted
			// (rules.Op.Legacy): the same bytes with '#' for "%#".
			want:      []string{"tags set_add " + mustKey(t, "p:", "tags:{p}", map[string]string{"p": long}) + " t", "tags set_delete " + legacyHashedKey("p:tags:"+long) + " legacy"},
			wantStats: rules.PlanStats{Rules: 1},
		},

		// count rules
		{
			name:      "count insert holding when: +1",
			ev:        rules.Event{Database: "blog", Table: "comments", Operation: rules.Insert, After: row("id=1", "post_id=3", "approved=1")},
			want:      []string{"comments count p:comments:3 +1 args=int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "count insert failing when: nothing",
			ev:        rules.Event{Database: "blog", Table: "comments", Operation: rules.Insert, After: row("id=1", "post_id=3", "approved=0")},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "count update entering the predicate: +1",
			ev: rules.Event{Database: "blog", Table: "comments", Operation: rules.Update,
				Before: row("id=1", "post_id=3", "approved=0"), After: row("id=1", "post_id=3", "approved=1")},
			want:      []string{"comments count p:comments:3 +1 args=int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "count update leaving the predicate: -1",
			ev: rules.Event{Database: "blog", Table: "comments", Operation: rules.Update,
				Before: row("id=1", "post_id=3", "approved=1"), After: row("id=1", "post_id=3", "approved=0")},
			want:      []string{"comments count p:comments:3 -1 args=int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "count update moving the row: -1 old key, +1 new key",
			ev: rules.Event{Database: "blog", Table: "comments", Operation: rules.Update,
				Before: row("id=1", "post_id=3", "approved=1"), After: row("id=1", "post_id=4", "approved=1")},
			want: []string{
				"comments count p:comments:3 -1 args=int:3",
				"comments count p:comments:4 +1 args=int:4",
			},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name: "count update within one key cancels",
			ev: rules.Event{Database: "blog", Table: "comments", Operation: rules.Update,
				Before: row("id=1", "post_id=3", "approved=1", "body='a'"), After: row("id=1", "post_id=3", "approved=1", "body='b'")},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "count delete: -1",
			ev:        rules.Event{Database: "blog", Table: "comments", Operation: rules.Delete, Before: row("id=1", "post_id=3", "approved=1")},
			want:      []string{"comments count p:comments:3 -1 args=int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "count update without before image recounts whatever when says",
			ev:        rules.Event{Database: "blog", Table: "comments", Operation: rules.Update, After: row("id=1", "post_id=3", "approved=0")},
			want:      []string{"comments recount p:comments:3 args=int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "count with explicit args in their own order",
			ev:        rules.Event{Database: "blog", Table: "views", Operation: rules.Insert, After: row("post_id=3", "kind='like'")},
			want:      []string{"page-views count p:views:3:like +1 args=string:like,int:3"},
			wantStats: rules.PlanStats{Rules: 1},
		},
		{
			name:      "on without delete: delete plans nothing",
			ev:        rules.Event{Database: "blog", Table: "views", Operation: rules.Delete, Before: row("post_id=3", "kind='like'")},
			wantStats: rules.PlanStats{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := tc.ev
			ev.Source = rules.Position{Topic: "t", Partition: 2, Offset: 99}
			sentinel := rules.Op{Kind: rules.OpBump, Key: "earlier"}
			ops, st, err := rs.Plan([]rules.Op{sentinel}, &ev)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if ops[0].Key != "earlier" {
				t.Fatalf("Plan changed an op already in dst: %+v", ops[0])
			}
			var got []string
			for _, op := range ops[1:] {
				got = append(got, opString(op))
				if op.Source != ev.Source {
					t.Errorf("op %s: Source = %+v, want %+v", opString(op), op.Source, ev.Source)
				}
				checkLegalKey(t, op.Key)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ops:\n got %q\nwant %q", got, tc.want)
			}
			if st != tc.wantStats {
				t.Errorf("stats = %+v, want %+v", st, tc.wantStats)
			}
		})
	}
}

func mustKey(t testing.TB, prefix, tmpl string, values map[string]string) string {
	t.Helper()
	k, err := rules.Key(prefix, tmpl, values)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// checkLegalKey fails unless key is a legal memcached key.
func checkLegalKey(t testing.TB, key string) {
	t.Helper()
	if key == "" || len(key) > rules.MaxKeyLen {
		t.Errorf("key %q: length %d", key, len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= 0x20 || c == 0x7f {
			t.Errorf("key %q: byte 0x%02x at %d", key, c, i)
		}
	}
}

func TestPlanEventErrors(t *testing.T) {
	rs := loadFixture(t, "testdata/plan.yaml")
	tests := []struct {
		name string
		ev   rules.Event
		want rules.EventError
	}{
		{
			name: "key column missing from the after image",
			ev:   rules.Event{Database: "shop", Table: "users", Operation: rules.Insert, After: row("name='a'", "active=0")},
			want: rules.EventError{Rule: "profile", Image: "after", Column: "id"},
		},
		{
			name: "key column missing from the before image of a later rule",
			ev:   rules.Event{Database: "shop", Table: "users", Operation: rules.Delete, Before: row("id=1", "active=1")},
			want: rules.EventError{Rule: "by-org", Image: "before", Column: "org_id"},
		},
		{
			name: "columns entry missing from the before image",
			ev: rules.Event{Database: "shop", Table: "users", Operation: rules.Update,
				Before: row("id=1", "name='a'"), After: row("id=1", "name='a'", "email='b'")},
			want: rules.EventError{Rule: "profile", Image: "before", Column: "email"},
		},
		{
			name: "member column missing",
			ev:   rules.Event{Database: "shop", Table: "user_interests", Operation: rules.Insert, After: row("user_id=1", "active=1")},
			want: rules.EventError{Rule: "interests", Image: "after", Column: "interest_id"},
		},
		{
			name: "args column missing",
			ev:   rules.Event{Database: "blog", Table: "views", Operation: rules.Insert, After: row("post_id=1", "kind_x=1")},
			want: rules.EventError{Rule: "page-views", Image: "after", Column: "kind"},
		},
		{
			name: "update without after image",
			ev:   rules.Event{Database: "blog", Table: "comments", Operation: rules.Update, Before: row("post_id=1", "approved=1")},
			want: rules.EventError{Rule: "comments", Image: "after", Reason: "missing; an update needs it"},
		},
		{
			name: "delete without before image",
			ev:   rules.Event{Database: "blog", Table: "comments", Operation: rules.Delete},
			want: rules.EventError{Rule: "comments", Image: "before", Reason: "missing; a delete needs it"},
		},
		{
			name: "insert without after image",
			ev:   rules.Event{Database: "blog", Table: "comments", Operation: rules.Insert},
			want: rules.EventError{Rule: "comments", Image: "after", Reason: "missing; an insert needs it"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []rules.Op{{Kind: rules.OpBump, Key: "earlier"}}
			ops, _, err := rs.Plan(dst, &tc.ev)
			var ee *rules.EventError
			if !errors.As(err, &ee) {
				t.Fatalf("err = %v, want *EventError", err)
			}
			if *ee != tc.want {
				t.Errorf("err = %+v, want %+v", *ee, tc.want)
			}
			if len(ops) != 1 || ops[0].Key != "earlier" {
				t.Errorf("ops after error = %+v, want only the op given in dst", ops)
			}
			if ee.Error() == "" || !strings.Contains(ee.Error(), tc.want.Rule) {
				t.Errorf("Error() = %q", ee.Error())
			}
		})
	}
}

func TestPlanEmptyKey(t *testing.T) {
	rs, err := rulefile.Parse("t.yaml", []byte(`version: 1
rules:
  - name: r
    table: t
    bump: "{id}"
`))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = rs.Plan(nil, &rules.Event{Table: "t", Operation: rules.Insert, After: row("id=''")})
	var ee *rules.EventError
	if !errors.As(err, &ee) || ee.Reason != "the key renders empty" {
		t.Fatalf("err = %v, want an empty-key EventError", err)
	}
	ops, _, err := rs.Plan(nil, &rules.Event{Table: "t", Operation: rules.Insert, After: row("id=' '")})
	if err != nil || len(ops) != 1 || ops[0].Key != "%20" {
		t.Fatalf("ops = %+v, err = %v; want key %%20", ops, err)
	}
}

// TestPlanAllocs pins the planner's allocation budget: an update event
// matching two rules costs one allocation for all its key and member
// strings, plus one for the query args.
func TestPlanAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	rs, ev := benchSetup(t)
	dst := make([]rules.Op, 0, 16)
	allocs := testing.AllocsPerRun(200, func() {
		ops, _, err := rs.Plan(dst[:0], ev)
		if err != nil || len(ops) != 3 {
			t.Fatalf("ops = %d, err = %v", len(ops), err)
		}
	})
	if allocs > 3 {
		t.Errorf("Plan allocates %.1f times per event, want <= 3", allocs)
	}
}

// TestPlanConcurrent plans different events from several goroutines at
// once (run with -race): each must get exactly its sequential result.
func TestPlanConcurrent(t *testing.T) {
	rs := loadFixture(t, "testdata/plan.yaml")
	events := []*rules.Event{
		{Database: "shop", Table: "users", Operation: rules.Insert, After: row("id=1", "active=1", "org_id=2")},
		{Database: "shop", Table: "user_interests", Operation: rules.Update,
			Before: row("user_id=5", "interest_id=9", "active=1"), After: row("user_id=6", "interest_id=9", "active=1")},
		{Database: "blog", Table: "comments", Operation: rules.Delete, Before: row("post_id=3", "approved=1")},
		{Database: "blog", Table: "tags", Operation: rules.Insert, After: row("post_id='"+strings.Repeat("z", 400)+"'", "tag='a b'")},
	}
	want := make([][]string, len(events))
	for i, ev := range events {
		ops, _, err := rs.Plan(nil, ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			want[i] = append(want[i], opString(op))
		}
	}
	done := make(chan error)
	for g := range 4 {
		go func() {
			var dst []rules.Op
			for n := range 300 {
				i := (g + n) % len(events)
				var err error
				dst, _, err = rs.Plan(dst[:0], events[i])
				if err == nil && len(dst) != len(want[i]) {
					err = fmt.Errorf("event %d: %d ops, want %d", i, len(dst), len(want[i]))
				}
				if err == nil {
					for k, op := range dst {
						if k >= len(want[i]) || opString(op) != want[i][k] {
							err = fmt.Errorf("event %d: op %d = %q, want %q", i, k, opString(op), want[i])
							break
						}
					}
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func TestNames(t *testing.T) {
	for op, name := range map[rules.OpKind]string{rules.OpBump: "bump", rules.OpSetAdd: "set_add", rules.OpSetRemove: "set_remove",
		rules.OpCount: "count", rules.OpRecount: "recount", rules.OpSetAppend: "set_append", 0: "unknown"} {
		if op.String() != name {
			t.Errorf("OpKind(%d).String() = %q, want %q", op, op.String(), name)
		}
	}
	for k, name := range map[rules.RuleKind]string{rules.BumpRule: "bump", rules.SetRule: "set", rules.CountRule: "count", 0: "unknown"} {
		if k.String() != name {
			t.Errorf("RuleKind(%d).String() = %q, want %q", k, k.String(), name)
		}
	}
	for _, op := range []rules.Operation{rules.Insert, rules.Update, rules.Delete, rules.Read, rules.Truncate} {
		if back, ok := rules.ParseOperation(op.String()); !ok || back != op {
			t.Errorf("ParseOperation(%q) = %v, %v", op.String(), back, ok)
		}
	}
	s := rules.PlanStats{Rules: 1, NullKeys: 2, Unchanged: 3}
	s.Add(rules.PlanStats{Rules: 10, NullKeys: 20, Unchanged: 30})
	if s != (rules.PlanStats{Rules: 11, NullKeys: 22, Unchanged: 33}) {
		t.Errorf("Add = %+v", s)
	}
}

func TestPlanColumnsCountWhenFlip(t *testing.T) {
	rs, err := rulefile.Parse("inline.yaml", []byte(`version: 1
rules:
  - name: visible-user
    table: shop.users
    when: "active == 1"
    columns: [name]
    bump: "ns:user:{id}"
`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name          string
		before, after rules.Row
		want          int
	}{
		{"when turns false", row("id=1", "name='a'", "active=1"), row("id=1", "name='a'", "active=0"), 1},
		{"when turns true", row("id=1", "name='a'", "active=0"), row("id=1", "name='a'", "active=1"), 1},
		{"nothing listed changed", row("id=1", "name='a'", "active=1", "x=1"), row("id=1", "name='a'", "active=1", "x=2"), 0},
	}
	for _, c := range cases {
		ops, _, err := rs.Plan(nil, &rules.Event{Database: "shop", Table: "users", Operation: rules.Update, Before: c.before, After: c.after})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(ops) != c.want {
			t.Errorf("%s: %d ops (%v), want %d", c.name, len(ops), ops, c.want)
		}
	}
}

// legacyHashedKey is the long-key rule of releases before the "%#" mark,
// written out independently: 200 bytes, '#', 32 hex digits of SHA-256.
func legacyHashedKey(full string) string {
	sum := sha256.Sum256([]byte(full))
	return full[:200] + "#" + hex.EncodeToString(sum[:])[:32]
}

// TestPlanLegacyKeys: for a hashed long key and for every hot-key copy,
// the planner adds an op on the key earlier releases used (a bump for a
// bump, a delete for a set or counter change), marked Legacy, after the
// op on the key of this release; short keys get none.
func TestPlanLegacyKeys(t *testing.T) {
	rs, err := rulefile.Parse("legacy.yaml", []byte(`version: 1
prefix: "p:"
rules:
  - name: user
    table: shop.users
    bump: "ns:user:{id}"
  - name: hot
    table: shop.catalog
    bump: "ns:cat:{id}"
    copies: 2
  - name: likes
    table: shop.likes
    count:
      key: "likes:{id}"
      recount: "SELECT COUNT(*) FROM likes WHERE id = ?"
`))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 260)
	plan := func(table, id string) []string {
		t.Helper()
		ops, _, err := rs.Plan(nil, &rules.Event{Database: "shop", Table: table, Operation: rules.Insert, After: row("id='" + id + "'")})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, op := range ops {
			got = append(got, opString(op))
			checkLegalKey(t, op.Key)
		}
		return got
	}
	for _, tc := range []struct {
		table, id string
		want      []string
	}{
		{"users", "42", []string{"user bump p:ns:user:42"}},
		{"users", long, []string{"user bump " + mustKey(t, "p:", "ns:user:{id}", map[string]string{"id": long}), "user bump " + legacyHashedKey("p:ns:user:"+long) + " legacy"}},
		{"likes", long, []string{"likes count " + mustKey(t, "p:", "likes:{id}", map[string]string{"id": long}) + " +1 args=string:" + long, "likes set_delete " + legacyHashedKey("p:likes:"+long) + " legacy"}},
		{"catalog", "7", []string{"hot bump p:ns:cat:7%copy0", "hot bump p:ns:cat:7#0 legacy", "hot bump p:ns:cat:7%copy1", "hot bump p:ns:cat:7#1 legacy"}},
		{"catalog", long, []string{
			"hot bump " + rules.FinishKey([]byte("p:ns:cat:"+long+"%copy0")), "hot bump " + legacyHashedKey("p:ns:cat:"+long+"#0") + " legacy",
			"hot bump " + rules.FinishKey([]byte("p:ns:cat:"+long+"%copy1")), "hot bump " + legacyHashedKey("p:ns:cat:"+long+"#1") + " legacy",
		}},
	} {
		if got := plan(tc.table, tc.id); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s:\n got %q\nwant %q", tc.table, abbrev(tc.id), got, tc.want)
		}
	}
}

// TestReads: a table is read when a rule names it with its database, or
// without one (any database).
func TestReads(t *testing.T) {
	rs := loadFixture(t, "testdata/plan.yaml")
	for _, tt := range []struct {
		db, table string
		want      bool
	}{
		{"shop", "users", true},
		{"other", "users", true}, // a rule names users without a database
		{"shop", "user_interests", true},
		{"other", "user_interests", false},
		{"shop", "orders", false},
		{"", "nothing", false},
	} {
		if got := rs.Reads(tt.db, tt.table); got != tt.want {
			t.Errorf("Reads(%q, %q) = %v, want %v", tt.db, tt.table, got, tt.want)
		}
	}
}

// TestQueries: only tables with a rule that loads or recounts query.
func TestQueries(t *testing.T) {
	rs := loadFixture(t, "testdata/plan.yaml")
	var withQuery, without []string
	for _, r := range rs.Rules() {
		db := r.Database
		if db == "" {
			db = "any"
		}
		if rs.Queries(db, r.Table) {
			withQuery = append(withQuery, db+"."+r.Table)
		} else {
			without = append(without, db+"."+r.Table)
		}
	}
	for _, r := range rs.Rules() {
		if r.Query != "" && !rs.Queries(r.Database, r.Table) {
			t.Errorf("rule %s queries but Queries(%q, %q) is false", r.Name, r.Database, r.Table)
		}
	}
	if rs.Queries("shop", "no_such_table") {
		t.Error("Queries of a table without rules is true")
	}
	if len(withQuery) == 0 || len(without) == 0 {
		t.Fatalf("fixture: tables with a query %v, without %v; want both kinds", withQuery, without)
	}
}
