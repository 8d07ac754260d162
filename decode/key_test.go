package decode

import (
	"slices"
	"testing"
)

func TestKeyColumns(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		want      []string
		perTable  bool
	}{
		{"debezium", `{"id":5}`, []string{"id"}, false},
		{"debezium composite", `{"user_id":1,"interest_id":7}`, []string{"interest_id", "user_id"}, false},
		{"debezium with schema", `{"schema":{"type":"struct","fields":[{"field":"id"}]},"payload":{"id":5}}`, []string{"id"}, false},
		{"a column named payload", `{"payload":1,"id":2}`, []string{"id", "payload"}, false},
		{"maxwell", `{"database":"shop","table":"users","pk.id":5}`, []string{"id"}, false},
		{"maxwell composite", `{"database":"shop","table":"ui","pk.user_id":1,"pk.interest_id":2}`, []string{"interest_id", "user_id"}, false},
		{"maxwell by table", `{"database":"shop","table":"ui"}`, nil, true},
		{"columns named database and table", `{"database":"shop","table":"ui","id":3}`, []string{"database", "id", "table"}, false},
		{"canal string key", `shop.users`, nil, false},
		{"null", `null`, nil, false},
		{"empty", ``, nil, false},
		{"empty object", `{}`, nil, false},
		{"broken", `{"id":`, nil, false},
	} {
		got, perTable, ok := KeyColumns([]byte(tc.key))
		if !slices.Equal(got, tc.want) || perTable != tc.perTable || ok != (tc.want != nil || tc.perTable) {
			t.Errorf("%s: KeyColumns(%s) = %q, %v, %v; want %q, %v", tc.name, tc.key, got, perTable, ok, tc.want, tc.perTable)
		}
	}
}

func FuzzKeyColumns(f *testing.F) {
	for _, s := range []string{`{"id":5}`, `{"schema":{},"payload":{"a":1}}`, `{"pk.id":1,"database":"d"}`, `x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		cols, perTable, ok := KeyColumns(key)
		if ok != (len(cols) > 0 || perTable) || (perTable && len(cols) > 0) || !slices.IsSorted(cols) {
			t.Fatalf("KeyColumns(%q) = %q, %v, %v", key, cols, perTable, ok)
		}
	})
}
