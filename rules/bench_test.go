package rules_test

import (
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

const benchRules = `version: 1
prefix: "shop:"
rules:
  - name: order
    table: shop.orders
    columns: [status, total]
    bump: "ns:order:{id}"
  - name: orders-by-status
    table: shop.orders
    when: "deleted_at == nil && total >= 0"
    set:
      key: "orders:{customer_id}:{status}"
      member: "{id}"
      load: "SELECT id FROM orders WHERE customer_id = ? AND status = ? AND deleted_at IS NULL"
  - name: unrelated
    table: shop.customers
    bump: "ns:customer:{id}"
`

// benchSetup returns the benchmark rules and an update event of about 800
// bytes as Debezium JSON (two images of 16 columns) that moves an order
// between two status sets: three ops from two rules.
func benchSetup(tb testing.TB) (*rules.RuleSet, *rules.Event) {
	tb.Helper()
	rs, err := rulefile.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		tb.Fatal(err)
	}
	image := func(status, updated string) rules.Row {
		return rules.Row{
			{"id", rules.Value{rules.KindInt, "9223372036854775807"}},
			{"customer_id", rules.Value{rules.KindInt, "1234567"}},
			{"status", rules.Value{rules.KindString, status}},
			{"total", rules.Value{rules.KindString, "149.90"}},
			{"currency", rules.Value{rules.KindString, "EUR"}},
			{"items", rules.Value{rules.KindInt, "3"}},
			{"coupon", rules.Value{}},
			{"created_at", rules.Value{rules.KindString, "2024-05-01T10:11:12Z"}},
			{"updated_at", rules.Value{rules.KindString, updated}},
			{"deleted_at", rules.Value{}},
			{"shipping_name", rules.Value{rules.KindString, "Ada Lovelace"}},
			{"shipping_street", rules.Value{rules.KindString, "12 St James's Square"}},
			{"shipping_city", rules.Value{rules.KindString, "London"}},
			{"shipping_zip", rules.Value{rules.KindString, "SW1Y 4JH"}},
			{"gift", rules.Value{rules.KindBool, "0"}},
			{"notes", rules.Value{rules.KindString, "leave with the porter"}},
		}
	}
	ev := &rules.Event{
		Database:  "shop",
		Table:     "orders",
		Operation: rules.Update,
		Before:    image("paid", "2024-05-01T10:11:12Z"),
		After:     image("shipped", "2024-05-02T08:00:00Z"),
		Source:    rules.Position{Topic: "dbserver1.shop.orders", Partition: 3, Offset: 123456, BinlogFile: "mysql-bin.000003", BinlogPos: 4567, TsMs: 1714636800000},
	}
	return rs, ev
}

// BenchmarkPlan plans one update event matching two rules (a bump with
// columns and a set whose membership moves): three ops.
func BenchmarkPlan(b *testing.B) {
	rs, ev := benchSetup(b)
	dst := make([]rules.Op, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		ops, _, err := rs.Plan(dst[:0], ev)
		if err != nil || len(ops) != 3 {
			b.Fatalf("ops = %d, err = %v", len(ops), err)
		}
	}
}

// BenchmarkPlanParallel is BenchmarkPlan from all procs at once, which
// exercises the scratch pool.
func BenchmarkPlanParallel(b *testing.B) {
	rs, ev := benchSetup(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]rules.Op, 0, 16)
		for pb.Next() {
			if _, _, err := rs.Plan(dst[:0], ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPlanLongKey plans an insert whose set key renders 300 bytes
// and is hashed in the planner's buffer: one op.
func BenchmarkPlanLongKey(b *testing.B) {
	rs, err := rulefile.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	long := strings.Repeat("s", 280)
	ev := &rules.Event{Database: "shop", Table: "orders", Operation: rules.Insert, After: rules.Row{
		{"id", rules.Value{rules.KindInt, "42"}},
		{"customer_id", rules.Value{rules.KindInt, "1234567"}},
		{"status", rules.Value{rules.KindString, long}},
		{"total", rules.Value{rules.KindString, "149.90"}},
		{"deleted_at", rules.Value{}},
	}}
	dst := make([]rules.Op, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		ops, _, err := rs.Plan(dst[:0], ev)
		if err != nil || len(ops) != 2 || len(ops[1].Key) != rules.HashedKeyLen {
			b.Fatalf("ops = %+v, err = %v", ops, err)
		}
	}
}
