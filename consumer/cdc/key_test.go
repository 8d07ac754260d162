package cdc

import (
	"slices"
	"testing"
)

func TestKeyColumns(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		want      []string
	}{
		{"debezium", `{"id":5}`, []string{"id"}},
		{"debezium composite", `{"user_id":1,"interest_id":7}`, []string{"interest_id", "user_id"}},
		{"debezium with schema", `{"schema":{"type":"struct","fields":[{"field":"id"}]},"payload":{"id":5}}`, []string{"id"}},
		{"a column named payload", `{"payload":1,"id":2}`, []string{"id", "payload"}},
		{"maxwell", `{"database":"shop","table":"users","pk.id":5}`, []string{"id"}},
		{"maxwell composite", `{"database":"shop","table":"ui","pk.user_id":1,"pk.interest_id":2}`, []string{"interest_id", "user_id"}},
		{"canal string key", `shop.users`, nil},
		{"null", `null`, nil},
		{"empty", ``, nil},
		{"empty object", `{}`, nil},
		{"broken", `{"id":`, nil},
	} {
		got, ok := KeyColumns([]byte(tc.key))
		if !slices.Equal(got, tc.want) || ok != (tc.want != nil) {
			t.Errorf("%s: KeyColumns(%s) = %q, %v; want %q", tc.name, tc.key, got, ok, tc.want)
		}
	}
}

func FuzzKeyColumns(f *testing.F) {
	for _, s := range []string{`{"id":5}`, `{"schema":{},"payload":{"a":1}}`, `{"pk.id":1,"database":"d"}`, `x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, key []byte) {
		cols, ok := KeyColumns(key)
		if ok != (len(cols) > 0) || !slices.IsSorted(cols) {
			t.Fatalf("KeyColumns(%q) = %q, %v", key, cols, ok)
		}
	})
}
