package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Problem is one mistake found in a config file, located at the YAML node
// that holds it.
type Problem struct {
	File    string
	Line    int
	Column  int
	Message string
}

// String formats the problem as "file:line:col: message".
func (p Problem) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Column, p.Message)
}

// Error is every problem found in one config file, in file order. Load and
// Parse return it (wrapped with rule-file errors, if any) so that an
// operator sees every mistake at once instead of one per attempt.
type Error struct {
	Problems []Problem
}

// Error returns one "file:line:col: message" line per problem.
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.String())
	}
	return b.String()
}

func sortProblems(ps []Problem) {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}
