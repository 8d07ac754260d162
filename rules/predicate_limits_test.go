package rules

import (
	"errors"
	"strings"
	"testing"
)

// TestPredicateHostile compiles `when` expressions made to exhaust expr's
// recursive parser: each is refused with a PredicateError naming the
// limit, before expr sees it.
func TestPredicateHostile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		expr      string
		want      string
		line, col int
	}{
		{name: "1,000,000 nots", expr: strings.Repeat("!", 1_000_000) + "a",
			want: "expression is 1000001 bytes, more than the limit of 16384"},
		{name: "200,000 nots", expr: strings.Repeat("!", 200_000) + "a",
			want: "expression is 200001 bytes, more than the limit of 16384"},
		{name: "nots at the limit of nesting", expr: strings.Repeat("!", 33) + "a",
			want: "expression nests more than 32 levels deep (the limit)", col: 32},
		{name: "nots and spaces", expr: strings.Repeat("not ", 40) + "a",
			want: "expression nests more than 32 levels deep (the limit)", col: 128},
		{name: "parentheses", expr: "a == 1 ||\n" + strings.Repeat("(", 40) + "b" + strings.Repeat(")", 40),
			want: "expression nests more than 32 levels deep (the limit)", line: 2, col: 32},
		{name: "lists", expr: "a in " + strings.Repeat("[", 40) + strings.Repeat("]", 40),
			want: "expression nests more than 32 levels deep (the limit)", col: 37},
		{name: "brackets in a string do not count", expr: "a == '" + strings.Repeat("(", 40) + "'"},
		{name: "32 levels", expr: strings.Repeat("!(", 16) + "a" + strings.Repeat(")", 16)},
		{name: "a long chain of ors", expr: "a == 0" + strings.Repeat(" || a == 1", 1600)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compilePredicate(tc.expr)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("compile: %v", err)
				}
				return
			}
			var pe *PredicateError
			if !errors.As(err, &pe) {
				t.Fatalf("compile: err = %v, want a PredicateError", err)
			}
			if line := max(tc.line, 1); pe.Msg != tc.want || pe.Line != line || pe.Column != tc.col {
				t.Errorf("compile: error %q at %d:%d, want %q at %d:%d", pe.Msg, pe.Line, pe.Column, tc.want, line, tc.col)
			}
		})
	}
}

// FuzzPredicateCompile checks that any expression compiles or fails with
// a PredicateError inside it, without crashing.
func FuzzPredicateCompile(f *testing.F) {
	for _, s := range []string{"a == 1", "!(a) && not b", "a in [1, 'x(']", "-(-a) > 1", strings.Repeat("(", 40), "a ? b : c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		_, err := compilePredicate(src)
		if err == nil {
			return
		}
		var pe *PredicateError
		if !errors.As(err, &pe) {
			t.Fatalf("compile %q: err = %v, want a PredicateError", src, err)
		}
		if pe.Line < 1 || pe.Line > strings.Count(src, "\n")+1 || pe.Column < 0 || pe.Msg == "" {
			t.Fatalf("compile %q: error %q at %d:%d, outside the expression", src, pe.Msg, pe.Line, pe.Column)
		}
	})
}
