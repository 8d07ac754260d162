package rules

import (
	"slices"
	"testing"
)

// TestColumnsRead: every column a rule reads is listed, whatever reads
// it; planning rows cut down to those columns gives the same ops.
func TestColumnsRead(t *testing.T) {
	rs, err := Parse("cols.yaml", []byte(`version: 1
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
	full := func(status string) Row {
		return Row{{"id", Value{KindInt, "7"}}, {"customer_id", Value{KindInt, "3"}}, {"status", Value{KindString, status}},
			{"total", Value{KindString, "9.5"}}, {"deleted_at", Value{}}, {"kind", Value{KindString, "a"}}, {"x", Value{KindString, "b"}},
			{"flagged", Value{KindBool, "0"}}, {"name", Value{KindString, "zed"}}, {"sku", Value{KindString, "s1"}},
			{"region", Value{KindString, "eu"}}, {"note", Value{KindString, "unread"}}, {"updated_at", Value{KindString, "now"}}}
	}
	keep := func(r Row) Row {
		var out Row
		for _, c := range r {
			if slices.Contains(want, c.Name) {
				out = append(out, c)
			}
		}
		return out
	}
	ev := &Event{Database: "shop", Table: "orders", Operation: Update, Before: full("paid"), After: full("sent")}
	cut := &Event{Database: "shop", Table: "orders", Operation: Update, Before: keep(ev.Before), After: keep(ev.After)}
	a, _, err1 := rs.Plan(nil, ev)
	b, _, err2 := rs.Plan(nil, cut)
	if err1 != nil || err2 != nil || len(a) != 3 || !slices.EqualFunc(a, b, func(x, y Op) bool {
		return x.Kind == y.Kind && x.Key == y.Key && x.Member == y.Member && slices.Equal(x.Args, y.Args)
	}) {
		t.Fatalf("full rows plan %+v (%v), cut rows plan %+v (%v)", a, err1, b, err2)
	}
}
