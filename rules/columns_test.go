package rules_test

import (
	"slices"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// TestColumnsRead: every column a rule reads is listed, whatever reads
// it; planning rows cut down to those columns gives the same ops.
func TestColumnsRead(t *testing.T) {
	rs, err := rulefile.Parse("cols.yaml", []byte(`version: 1
prefix: "p:"
rules:
  - name: order
    table: shop.orders
    columns: [status, total]
    bump: "ns:order:{id}"
  - name: by-status
    table: shop.orders
    when: "deleted_at == nil && (kind in [\"a\", x] || not flagged) && name startsWith \"z\""
    set:
      key: "orders:{customer_id}:{status}"
      member: "{id}:{sku}"
      load: "SELECT id FROM orders WHERE customer_id = ? AND region = ?"
      args: [customer_id, region]
  - name: comments
    table: blog.comments
    count:
      key: "comments:{post_id}"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"customer_id", "deleted_at", "flagged", "id", "kind", "name", "post_id", "region", "sku", "status", "total", "x"}
	if got := rs.ColumnsRead(); !slices.Equal(got, want) {
		t.Fatalf("ColumnsRead = %q, want %q", got, want)
	}
	full := func(status string) rules.Row {
		return rules.Row{{"id", rules.Value{rules.KindInt, "7"}}, {"customer_id", rules.Value{rules.KindInt, "3"}}, {"status", rules.Value{rules.KindString, status}},
			{"total", rules.Value{rules.KindString, "9.5"}}, {"deleted_at", rules.Value{}}, {"kind", rules.Value{rules.KindString, "a"}}, {"x", rules.Value{rules.KindString, "b"}},
			{"flagged", rules.Value{rules.KindBool, "0"}}, {"name", rules.Value{rules.KindString, "zed"}}, {"sku", rules.Value{rules.KindString, "s1"}},
			{"region", rules.Value{rules.KindString, "eu"}}, {"note", rules.Value{rules.KindString, "unread"}}, {"updated_at", rules.Value{rules.KindString, "now"}}}
	}
	keep := func(r rules.Row) rules.Row {
		var out rules.Row
		for _, c := range r {
			if slices.Contains(want, c.Name) {
				out = append(out, c)
			}
		}
		return out
	}
	ev := &rules.Event{Database: "shop", Table: "orders", Operation: rules.Update, Before: full("paid"), After: full("sent")}
	cut := &rules.Event{Database: "shop", Table: "orders", Operation: rules.Update, Before: keep(ev.Before), After: keep(ev.After)}
	a, _, err1 := rs.Plan(nil, ev)
	b, _, err2 := rs.Plan(nil, cut)
	if err1 != nil || err2 != nil || len(a) != 3 || !slices.EqualFunc(a, b, func(x, y rules.Op) bool {
		return x.Kind == y.Kind && x.Key == y.Key && x.Member == y.Member && slices.Equal(x.Args, y.Args)
	}) {
		t.Fatalf("full rows plan %+v (%v), cut rows plan %+v (%v)", a, err1, b, err2)
	}
}
