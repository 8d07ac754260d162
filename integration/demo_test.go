package integration

import (
	"slices"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

func TestDemoSampleOpKeys(t *testing.T) {
	bump := &rules.Rule{Name: "user", Kind: rules.BumpRule}
	set := &rules.Rule{Name: "user-interests", Kind: rules.SetRule}
	count := &rules.Rule{Name: "post-comments", Kind: rules.CountRule}
	ops := []rules.Op{
		{Rule: bump, Key: "ns:user:1"},
		{Rule: bump, Key: "ns:user:2"},
		{Rule: set, Key: "interests:1"},
		{Rule: set, Key: "interests:1"},
		{Rule: bump, Key: "ns:user:1"},
		{Rule: count, Key: "comments:7"},
		{Rule: set, Key: "interests:2"},
	}
	for _, tc := range []struct {
		n    int
		want []string
	}{
		{0, nil},
		{1, []string{"ns:user:1"}},
		// One key per rule kind first, in op order.
		{3, []string{"ns:user:1", "interests:1", "comments:7"}},
		// Then the remaining distinct keys, in op order.
		{4, []string{"ns:user:1", "interests:1", "comments:7", "ns:user:2"}},
		{10, []string{"ns:user:1", "interests:1", "comments:7", "ns:user:2", "interests:2"}},
	} {
		if got := sampleOpKeys(ops, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("sampleOpKeys(ops, %d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestDemoIsSetRuleKey(t *testing.T) {
	rs, err := rulefile.LoadPaths(exampleRules)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{
		"shop:interests:42":          true,
		"shop:category:3:products":   true,
		"shop:ns:user:42":            false,
		"blog:interests:42":          false,
		"interests:42":               false,
		"blog:comments:7":            false, // a counter
		"shop:category:3:namespaces": true,  // the literal start of the template matches
	} {
		if got := isSetRuleKey(rs, key); got != want {
			t.Errorf("isSetRuleKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestDemoCountChangesByTable(t *testing.T) {
	change := func(table string) Change {
		return Change{Event: rules.Event{Table: table}}
	}
	for _, tc := range []struct {
		changes []Change
		want    string
	}{
		{nil, ""},
		{[]Change{change("users")}, "1 users"},
		{[]Change{change("users"), change("posts"), change("users"), change("comments"), change("posts")}, "2 users, 2 posts, 1 comments"},
	} {
		if got := countChangesByTable(tc.changes); got != tc.want {
			t.Errorf("countChangesByTable(%d changes) = %q, want %q", len(tc.changes), got, tc.want)
		}
	}
}
