package rulefile

import (
	"slices"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

func TestFallbackKeys(t *testing.T) {
	rs, err := ParseFiles(
		File{Name: "shop.yaml", Data: []byte(`version: 1
prefix: "shop:"
fallback: "tbl:{db}.{table}"
rules:
  - {name: user, table: shop.users, bump: "ns:user:{id}"}
  - {name: user-count, table: shop.users, count: {key: "users:{team}"}}
  - {name: order, table: shop.orders, bump: "ns:order:{id}"}
`)},
		File{Name: "any.yaml", Data: []byte(`version: 1
fallback: "any:{table}"
rules:
  - {name: any-user, table: users, bump: "u:{id}"}
`)},
		File{Name: "none.yaml", Data: []byte(`version: 1
rules:
  - {name: plain-order, table: shop.orders, bump: "o:{id}"}
`)},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		db, table string
		want      []string
	}{
		{"shop", "users", []string{"shop:tbl:shop.users", "any:users"}},
		{"other", "users", []string{"any:users"}},
		{"shop", "orders", []string{"shop:tbl:shop.orders"}},
		{"shop", "items", nil},
		{"", "", []string{"shop:tbl:shop.users", "shop:tbl:shop.orders", "any:users"}},
	} {
		if got := rs.FallbackKeys(nil, tc.db, tc.table); !slices.Equal(got, tc.want) {
			t.Errorf("FallbackKeys(%q, %q) = %q, want %q", tc.db, tc.table, got, tc.want)
		}
	}
	op := rs.FallbackOp("shop:tbl:shop.users", rules.Position{Topic: "t", Offset: 3})
	if op.Kind != rules.OpBump || op.Rule == nil || op.Rule.TTL != 0 || op.Rule.RebumpAfter != 0 || op.Source.Offset != 3 {
		t.Errorf("FallbackOp = %+v", op)
	}
	if got := rs.Tables(); !slices.Equal(got, []string{"shop.users", "shop.orders", "users"}) {
		t.Errorf("Tables = %q", got)
	}
}
