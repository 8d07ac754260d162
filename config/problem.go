package config

import (
	"cmp"
	"slices"

	"github.com/cachewarden/cachewarden/rules"
)

// Problem is one mistake found in a config file, located at the YAML node
// that holds it; it prints as "file:line:col: message", like the problems
// of rule files.
type Problem = rules.Problem

// Error is every problem found in one config file, in file order. Load and
// Parse return it (wrapped with rule-file errors, if any) so that an
// operator sees every mistake at once instead of one per attempt.
type Error struct {
	Problems []Problem
}

// Error returns one "file:line:col: message" line per problem.
func (e *Error) Error() string {
	return (&rules.LoadError{Problems: e.Problems}).Error()
}

func sortProblems(ps []Problem) {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}
