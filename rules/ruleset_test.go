package rules

import (
	"errors"
	"strings"
	"testing"
)

func TestCountPlaceholders(t *testing.T) {
	tests := []struct {
		sql  string
		want int
	}{
		{"SELECT 1", 0},
		{"SELECT * FROM t WHERE a = ? AND b = ?", 2},
		{"SELECT '?', \"?\", `?` FROM t WHERE a = ?", 1},
		{`SELECT 'it''s ?', 'a\'?' FROM t WHERE a = ?`, 1},
		{"SELECT 1 -- ?\nFROM t WHERE a = ?", 1},
		{"SELECT 1 # ?\nFROM t WHERE a = ?", 1},
		{"SELECT 1 /* ? */ FROM t WHERE a = ? /* ?", 1},
		{"SELECT 1--1 FROM t WHERE a = ?", 1},
		{"SELECT ? FROM t WHERE a = '?", 1},
	}
	for _, tc := range tests {
		if got := CountPlaceholders(tc.sql); got != tc.want {
			t.Errorf("CountPlaceholders(%q) = %d, want %d", tc.sql, got, tc.want)
		}
	}
}

// TestNewRuleSet builds rules in Go, without a rule file, and plans with
// them; rules that NewRuleSet cannot accept are reported with their
// positions.
func TestNewRuleSet(t *testing.T) {
	key, err := ParseTemplate("ns:user:{id}")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := NewRuleSet([]*Rule{{Name: "user", Kind: BumpRule, Prefix: "shop:", Table: "users", Key: key, When: "active == 1"}})
	if err != nil {
		t.Fatal(err)
	}
	ops, _, err := rs.Plan(nil, &Event{Table: "users", Operation: Insert, After: row("id=42", "active=1")})
	if err != nil || len(ops) != 1 || ops[0].Key != "shop:ns:user:42" || ops[0].Kind != OpBump {
		t.Fatalf("plan = %+v, %v", ops, err)
	}
	if ops, _, _ := rs.Plan(nil, &Event{Table: "users", Operation: Insert, After: row("id=42", "active=0")}); len(ops) != 0 {
		t.Errorf("when is not applied: %+v", ops)
	}
	if !rs.Rule("user").Handles(Update) || rs.Rule("user").Handles(Read) {
		t.Error("on defaults to insert, update, delete")
	}

	_, err = NewRuleSet([]*Rule{
		{Name: "a", Kind: BumpRule, Table: "t", Key: key, File: "f.yaml", Line: 3, Column: 5},
		{Name: "a", Kind: SetRule, Table: "t", Key: key, File: "f.yaml", Line: 9, Column: 5, When: "a ==", Query: "SELECT ?", Args: []string{"x", "y"}},
	})
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v, want a *LoadError", err)
	}
	got := le.Error()
	for _, want := range []string{
		`f.yaml:9:5: rule "a": duplicate rule name (first defined at f.yaml:3:5)`,
		`f.yaml:9:5: rule "a": a member template belongs to set rules`,
		`f.yaml:9:5: rule "a": query has 1 '?' placeholder(s) but 2 args`,
		`f.yaml:9:5: rule "a": when: `,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems:\n%s\nwant one containing %q", got, want)
		}
	}
}
