package rules

import (
	"errors"
	"fmt"
	"hash/crc32"
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

// TestPlanCopiesAndEvidence: a rule with copies bumps every copy of the
// namespace (long keys hashed after the copy suffix); a rule with
// evidence carries the entity's bit.
func TestPlanCopiesAndEvidence(t *testing.T) {
	key, _ := ParseTemplate("ns:u:{id}")
	master, _ := ParseTemplate("ns:u:master")
	rs, err := NewRuleSet([]*Rule{
		{Name: "hot", Kind: BumpRule, Prefix: "p:", Table: "users", Key: key, Copies: 3},
		{Name: "ev", Kind: BumpRule, Prefix: "q:", Table: "users", Key: key, Evidence: &Evidence{Master: master, Bits: 16}},
	})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 260)
	ops, _, err := rs.Plan(nil, &Event{Table: "users", Operation: Update, Before: row("id=12543"), After: row("id='" + long + "'")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range ops {
		if op.Legacy {
			continue // TestPlanLegacyKeys
		}
		got = append(got, fmt.Sprintf("%s %s %d", op.Rule.Name, op.Key, op.EvidenceBit))
	}
	longKey := "p:ns:u:" + long
	want := []string{
		"hot p:ns:u:12543%copy0 0", "hot p:ns:u:12543%copy1 0", "hot p:ns:u:12543%copy2 0",
		"hot " + CopyKey([]byte(longKey), 0) + " 0", "hot " + CopyKey([]byte(longKey), 1) + " 0", "hot " + CopyKey([]byte(longKey), 2) + " 0",
		"ev q:ns:u:12543 15", // 12543 mod 16
		fmt.Sprintf("ev %s %d", FinishKey([]byte("q:ns:u:"+long)), crc32.ChecksumIEEE([]byte(long))%16),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ops:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if k := CopyKey([]byte(longKey), 2); len(k) != 234 || !strings.HasPrefix(k, longKey[:200]+"%#") {
		t.Errorf("long copy key %q", k)
	}
	if ev := rs.Rule("ev").Evidence; ev.MasterKey != "q:ns:u:master" || ev.Column != "id" || ev.MaxSet != 4 {
		t.Errorf("evidence completed as %+v", ev)
	}
}

func TestEvidenceBit(t *testing.T) {
	for _, tc := range []struct {
		id   string
		bits int
		want int
	}{
		{"12543", 64, 63}, {"0", 64, 0}, {"-7", 8, 7}, {"18446744073709551616", 64, 0},
		{"340282366920938463463374607431768211457", 64, 1}, {"007", 8, 7},
		{"abc", 64, int(crc32.ChecksumIEEE([]byte("abc")) % 64)}, {"", 8, 0}, {"-", 8, int(crc32.ChecksumIEEE([]byte("-")) % 8)},
	} {
		if got := EvidenceBit(tc.id, tc.bits); got != tc.want {
			t.Errorf("EvidenceBit(%q, %d) = %d, want %d", tc.id, tc.bits, got, tc.want)
		}
	}
}
