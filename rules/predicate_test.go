package rules

import (
	"errors"
	"strconv"
	"testing"

	"github.com/expr-lang/expr"
)

func TestPredicateEval(t *testing.T) {
	big := "9223372036854775808" // 2^63: beyond int64
	tests := []struct {
		expr string
		row  Row
		want bool
	}{
		{"active == 1", row("active=1"), true},
		{"active == 1", row("active=0"), false},
		{"active == 1", row("active=true"), true},
		{"active == true", row("active=1"), true},
		{"active == true", row("active='1'"), true},
		{"active", row("active=1"), true},
		{"active", row("active=0"), false},
		{"active", row("active=null"), false},
		{"active", row("active='yes'"), false},
		{"active", row(), false},
		{"!active", row("active=0"), true},
		{"not active", row("active=2"), false},
		{"active == 1", row(), false},
		{"deleted_at == nil", row("deleted_at=null"), true},
		{"deleted_at == nil", row(), true}, // missing reads as null
		{"deleted_at == null", row("deleted_at='2024-01-01'"), false},
		{"deleted_at != nil", row("deleted_at='2024-01-01'"), true},
		{"nil == deleted_at", row("deleted_at=null"), true},
		{"x != 5", row("x=null"), true},
		{"x < 5", row("x=null"), false},
		{"x >= 5", row("x=null"), false},
		{"x < 5 || x >= 5", row("x=null"), false},
		{"price > 10", row("price='10.50'"), true},
		{"price > 10.5", row("price='10.50'"), false},
		{"price >= 10.5", row("price='10.50'"), true},
		{"price == 10.5", row("price=10.50"), true},
		{"price == 0.1", row("price=1e-1"), true},
		{"price < 1e3", row("price=999.999"), true},
		{"price == -0.5", row("price=-5E-1"), true},
		{"price > -1", row("price=-0.999"), true},
		{"price < -1", row("price=-10"), true},
		{"price == 0", row("price=-0.0"), true},
		{"id == " + strconv.Quote(big), row("id=" + big), true},
		{"id > 9223372036854775807", row("id=" + big), true},
		{"id == 9223372036854775807", row("id=" + big), false},
		{"id < 9223372036854775807", row("id=9223372036854775806"), true},
		{"id > " + strconv.Quote(big), row("id=18446744073709551616"), true},
		{"a == b", row("a="+big, "b='"+big+"'"), true},
		{"a == b", row("a=10", "b=10.0"), true},
		{"a == b", row("a='007'", "b='7'"), false}, // two strings compare as text
		{"a == 7", row("a='007'"), true},           // a number against numeric text
		{"a < b", row("a='abc'", "b='abd'"), true},
		{"name == 'ann'", row("name='ann'"), true},
		{"name == 1", row("name='ann'"), false},
		{"name != 1", row("name='ann'"), true},
		{"name < 1", row("name='ann'"), false},
		{"name > 1", row("name='ann'"), false},
		{"x == 1", row("x=NaN"), false},
		{"status in ['a', 'b']", row("status='b'"), true},
		{"status in ['a', 'b']", row("status='c'"), false},
		{"status not in ['a', 'b']", row("status='c'"), true},
		{"kind in [1, 2, 3]", row("kind='2'"), true},
		{"kind in [1, nil]", row("kind=null"), true},
		{"kind in [other]", row("kind=3", "other=3"), true},
		{"name startsWith 'an'", row("name='ann'"), true},
		{"name endsWith 'nn'", row("name='ann'"), true},
		{"name contains 'n'", row("name='ann'"), true},
		{"name not contains 'x'", row("name='ann'"), true},
		{"name contains 'x'", row("name=null"), false},
		{"name matches '^a.n$'", row("name='ann'"), true},
		{"name matches '^a.n$'", row("name=null"), false},
		{"a == 1 && b == 2", row("a=1", "b=2"), true},
		{"a == 1 and b == 2", row("a=1", "b=3"), false},
		{"a == 1 || b == 2", row("a=0", "b=2"), true},
		{"a == 1 or b == 2", row("a=0", "b=3"), false},
		{"!(a == 1) && (b == 2 || c == 3)", row("a=0", "b=0", "c=3"), true},
		{"1 < x < 5", row("x=3"), true},
		{"1 < x < 5", row("x=5"), false},
		{"true", row(), true},
		{"false || x == -3", row("x=-3"), true},
		{"x == +3", row("x=3"), true},
		{"x == - -3", row("x=3"), true},
		{"j == '{\"a\":1}'", Row{{Name: "j", Value: Value{Kind: KindJSON, Text: `{"a":1}`}}}, true},
	}
	for _, tc := range tests {
		p, err := compilePredicate(tc.expr)
		if err != nil {
			t.Errorf("compile %q: %v", tc.expr, err)
			continue
		}
		if got := p.holds(tc.row); got != tc.want {
			t.Errorf("%q on %v = %v, want %v", tc.expr, tc.row, got, tc.want)
		}
	}
	var nilPred *predicate
	if !nilPred.holds(nil) {
		t.Errorf("a rule without when must hold")
	}
}

func TestPredicateCompileErrors(t *testing.T) {
	tests := []struct {
		expr      string
		line, col int
	}{
		{"a +", 1, 2},
		{"a + 1 == 2", 1, 2},
		{"len(a) > 1", 1, 0},
		{"f(a)", 1, 0},
		{"a ? b : c", 1, 8},
		{"a.b", 1, 2},
		{"a[0] == 1", 1, 1},
		{"1", 1, 0},
		{"'s'", 1, 0},
		{"nil", 1, 0},
		{"null", 1, 0},
		{"-a == 1", 1, 0},
		{"a in b", 1, 5},
		{"a matches b", 1, 10},
		{"a matches '['", 1, 10},
		{"let x = 1; x == 1", 1, 4},
		{"a == 1;\nb == 2", 1, 2},
		{"a == 1 &&\n  b ** 2", 2, 4},
		{"a == 99999999999999999999", 1, 24},
		{"", 1, 0},
	}
	for _, tc := range tests {
		_, err := compilePredicate(tc.expr)
		var ee *PredicateError
		if !errors.As(err, &ee) {
			t.Errorf("compile %q: err = %v, want a PredicateError", tc.expr, err)
			continue
		}
		if ee.Line != tc.line || ee.Column != tc.col {
			t.Errorf("compile %q: error %q at %d:%d, want %d:%d", tc.expr, ee.Msg, ee.Line, ee.Column, tc.line, tc.col)
		}
	}
}

// TestPredicateAgreesWithExpr compares the evaluator with expr's own VM
// where their semantics coincide: int64 and string columns, every column
// present and of the literal's type.
func TestPredicateAgreesWithExpr(t *testing.T) {
	exprs := []string{
		"a == 1", "a != 1", "a < 2", "a <= 2", "a > 2", "a >= 2", "1 < a < 3",
		"a == b", "a < b", "s == 'x'", "s < 'm'", "s startsWith 'a'", "s endsWith 'z'",
		"s contains 'b'", "s matches '^[a-c]+$'", "a in [1, 3, 5]", "s not in ['x', 'y']",
		"a == 1 && (b > 2 || !(s == 'x'))", "not (a >= 2) or b < -1",
	}
	rows := []struct {
		a, b int
		s    string
	}{{1, 2, "x"}, {2, 2, "abc"}, {3, -5, "z"}, {0, 0, ""}, {5, 1, "bz"}}
	for _, src := range exprs {
		p, err := compilePredicate(src)
		if err != nil {
			t.Fatalf("compile %q: %v", src, err)
		}
		prog, err := expr.Compile(src, expr.Env(map[string]any{"a": 0, "b": 0, "s": ""}), expr.AsBool())
		if err != nil {
			t.Fatalf("expr.Compile %q: %v", src, err)
		}
		for _, r := range rows {
			want, err := expr.Run(prog, map[string]any{"a": r.a, "b": r.b, "s": r.s})
			if err != nil {
				t.Fatalf("expr.Run %q: %v", src, err)
			}
			ours := p.holds(Row{
				{Name: "a", Value: Value{Kind: KindInt, Text: strconv.Itoa(r.a)}},
				{Name: "b", Value: Value{Kind: KindInt, Text: strconv.Itoa(r.b)}},
				{Name: "s", Value: Value{Kind: KindString, Text: r.s}},
			})
			if ours != want.(bool) {
				t.Errorf("%q with a=%d b=%d s=%q: ours %v, expr %v", src, r.a, r.b, r.s, ours, want)
			}
		}
	}
}

// TestPredicateEqualShortcut checks that the integer shortcut of == and
// in agrees with equalValues on every pair of a set of tricky values:
// signs, zeros, leading zeros, booleans, floats and numeric strings.
func TestPredicateEqualShortcut(t *testing.T) {
	values := []Value{
		{}, {Kind: KindInt, Text: "0"}, {Kind: KindInt, Text: "-0"}, {Kind: KindInt, Text: "00"},
		{Kind: KindInt, Text: "1"}, {Kind: KindInt, Text: "01"}, {Kind: KindInt, Text: "-1"},
		{Kind: KindInt, Text: "-01"}, {Kind: KindInt, Text: "+1"}, {Kind: KindInt, Text: "-"},
		{Kind: KindInt, Text: ""}, {Kind: KindInt, Text: "1x"}, {Kind: KindInt, Text: "12"},
		{Kind: KindInt, Text: "9223372036854775808"}, {Kind: KindInt, Text: "-9223372036854775809"},
		{Kind: KindBool, Text: "1"}, {Kind: KindBool, Text: "0"},
		{Kind: KindFloat, Text: "1.0"}, {Kind: KindFloat, Text: "1e0"}, {Kind: KindFloat, Text: "-0.0"},
		{Kind: KindString, Text: "1"}, {Kind: KindString, Text: "01"}, {Kind: KindString, Text: "x"},
		{Kind: KindJSON, Text: "1"},
	}
	for _, a := range values {
		for _, b := range values {
			if got, want := predicateEqual(a, b), equalValues(a, b); got != want {
				t.Errorf("predicateEqual(%v, %v) = %v, equalValues says %v", a, b, got, want)
			}
		}
	}
}

func BenchmarkPredicate(b *testing.B) {
	p, err := compilePredicate("deleted_at == nil && total >= 0 && status in ['paid', 'shipped']")
	if err != nil {
		b.Fatal(err)
	}
	r := row("id=1", "status='paid'", "total='149.90'", "deleted_at=null")
	b.ReportAllocs()
	for b.Loop() {
		if !p.holds(r) {
			b.Fatal("does not hold")
		}
	}
}
