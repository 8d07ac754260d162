package ruletest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/decode"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// Result is the outcome of one test.
type Result struct {
	Test *Test
	// Failures describe each mismatch, one (possibly multi-line) text per
	// event that did not behave as expected; empty when the test passed.
	Failures []string
}

// Passed reports whether the test passed.
func (r *Result) Passed() bool { return len(r.Failures) == 0 }

// Summary counts the outcomes of RunFiles.
type Summary struct {
	Passed int
	Failed int
	// BrokenFiles counts test files that could not be run: unreadable,
	// invalid, or whose rule files failed to load.
	BrokenFiles int
}

// OK reports whether every test passed and every file could be run.
func (s Summary) OK() bool { return s.Failed == 0 && s.BrokenFiles == 0 }

// LoadRules loads the suite's rule files.
func (s *Suite) LoadRules() (*rules.RuleSet, error) {
	return rulefile.LoadPaths(s.RuleFiles...)
}

// Run runs every test of the suite against rs, in file order.
func (s *Suite) Run(rs *rules.RuleSet) []Result {
	results := make([]Result, len(s.Tests))
	for i, t := range s.Tests {
		results[i] = Result{Test: t, Failures: t.run(rs)}
	}
	return results
}

// outcome is what one event produced.
type outcome struct {
	ops []rules.Op
	err error
}

// run feeds the test's events through the decoder and the planner and
// compares the result with the expectations, event by event.
func (t *Test) run(rs *rules.RuleSet) []string {
	dec := &decode.Decoder{Format: t.Format, Table: t.Table}
	var decoded decode.Decoded
	got := make([]outcome, len(t.Events))
	for i, ev := range t.Events {
		got[i] = planEvent(dec, rs, &decoded, ev)
	}

	var failures []string
	exp, errs := t.Expect, t.Errors
	for i := range t.Events {
		n := i + 1
		var want []ExpectedOp
		for len(exp) > 0 && exp[0].Event == n {
			want = append(want, exp[0])
			exp = exp[1:]
		}
		var wantErr *ExpectedError
		if len(errs) > 0 && errs[0].Event == n {
			wantErr = &errs[0]
			errs = errs[1:]
		}
		if f := t.compare(n, want, wantErr, got[i]); f != "" {
			failures = append(failures, f)
		}
	}
	return failures
}

// planEvent decodes and plans one message value. Like the daemon, it keeps
// no op of a message any of whose rows failed.
func planEvent(dec *decode.Decoder, rs *rules.RuleSet, decoded *decode.Decoded, ev Event) outcome {
	if len(ev.Value) == 0 {
		return outcome{} // tombstone
	}
	if err := dec.Decode(ev.Value, rules.Position{Line: ev.Line}, decoded); err != nil {
		return outcome{err: err}
	}
	if decoded.Skip != "" {
		return outcome{}
	}
	var ops []rules.Op
	for i := range decoded.Events {
		var err error
		ops, _, err = rs.Plan(ops, &decoded.Events[i])
		if err != nil {
			if len(decoded.Events) > 1 {
				err = fmt.Errorf("row %d of %d: %w", i+1, len(decoded.Events), err)
			}
			return outcome{err: err}
		}
	}
	// The invalidations of earlier releases' keys (rules.Op.Legacy) are
	// the daemon's concern, not the rules': tests list the rules' own ops.
	ops = slices.DeleteFunc(ops, func(op rules.Op) bool { return op.Legacy })
	return outcome{ops: ops}
}

// compare checks one event's outcome and returns a failure text, or "".
func (t *Test) compare(n int, want []ExpectedOp, wantErr *ExpectedError, got outcome) string {
	var b strings.Builder
	switch {
	case got.err != nil && wantErr == nil:
		fmt.Fprintf(&b, "event %d (line %d): unexpected error: %v\n", n, t.Events[n-1].Line, got.err)
	case got.err == nil && wantErr != nil:
		fmt.Fprintf(&b, "event %d (line %d): expected an error containing %q, got none\n", n, t.Events[n-1].Line, wantErr.Contains)
	case got.err != nil && !strings.Contains(got.err.Error(), wantErr.Contains):
		fmt.Fprintf(&b, "event %d (line %d): expected an error containing %q, got: %v\n", n, t.Events[n-1].Line, wantErr.Contains, got.err)
	}
	wantLines := make([]string, len(want))
	for i := range want {
		wantLines[i] = formatExpected(&want[i])
	}
	gotLines := make([]string, len(got.ops))
	for i := range got.ops {
		gotLines[i] = formatOp(n, &got.ops[i], t.checkArgs)
	}
	if !slices.Equal(wantLines, gotLines) {
		fmt.Fprintf(&b, "event %d (line %d): ops differ (- expected, + got):\n", n, t.Events[n-1].Line)
		if len(wantLines) == 0 {
			b.WriteString("  (no op expected)\n")
		}
		if len(gotLines) == 0 {
			b.WriteString("  (no op planned)\n")
		}
		for _, d := range diffLines(wantLines, gotLines) {
			b.WriteString("  ")
			b.WriteString(d)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// formatExpected and formatOp render ops as YAML flow mappings in the
// syntax of the expect list, so a "+" line can be pasted into a test.
func formatExpected(e *ExpectedOp) string {
	var args []*string
	if e.HasArgs {
		args = e.Args
	}
	return formatFields(e.Event, e.Rule, e.Op, e.Key, e.Member, e.Delta, args, e.HasArgs)
}

func formatOp(event int, op *rules.Op, withArgs bool) string {
	name := ""
	if op.Rule != nil {
		name = op.Rule.Name
	}
	var args []*string
	if withArgs {
		for _, v := range op.Args {
			if v.IsNull() {
				args = append(args, nil)
				continue
			}
			text := v.Text
			args = append(args, &text)
		}
	}
	return formatFields(event, name, op.Kind, op.Key, op.Member, op.Delta, args, withArgs && len(op.Args) > 0)
}

func formatFields(event int, rule string, kind rules.OpKind, key, member string, delta int64, args []*string, withArgs bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{event: %d, rule: %s, op: %s, key: %s", event, yamlString(rule), kind, strconv.Quote(key))
	switch kind {
	case rules.OpSetAdd, rules.OpSetRemove:
		fmt.Fprintf(&b, ", member: %s", strconv.Quote(member))
	case rules.OpCount:
		fmt.Fprintf(&b, ", delta: %d", delta)
	}
	if withArgs {
		b.WriteString(", args: [")
		for i, a := range args {
			if i > 0 {
				b.WriteString(", ")
			}
			if a == nil {
				b.WriteString("null")
			} else {
				b.WriteString(strconv.Quote(*a))
			}
		}
		b.WriteString("]")
	}
	b.WriteString("}")
	return b.String()
}

// yamlString writes plain names as they are and quotes anything else.
func yamlString(s string) string {
	if s == "" {
		return `""`
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return strconv.Quote(s)
		}
	}
	return s
}

// diffLines returns a line diff of a (expected) and b (got) from their
// longest common subsequence: "- " lines only in a, "+ " lines only in b,
// "  " lines in both.
func diffLines(a, b []string) []string {
	// lcs[i][j] is the LCS length of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, "  "+a[i])
			i++
			j++
		case j < len(b) && (i == len(a) || lcs[i][j+1] > lcs[i+1][j]):
			out = append(out, "+ "+b[j])
			j++
		default:
			out = append(out, "- "+a[i])
			i++
		}
	}
	return out
}

// RunFiles loads and runs each test file and writes a report to w: one
// "ok" line per passing file, every failure with the test's name and
// location, and a final "N passed, M failed" line. Problems with a file
// itself (unreadable, invalid, rule files that do not load) are listed as
// "file:line:col: message" and counted in Summary.BrokenFiles. The error
// is non-nil only when writing to w fails.
func RunFiles(w io.Writer, paths ...string) (Summary, error) {
	bw := bufio.NewWriter(w)
	var sum Summary
	for _, path := range paths {
		runFile(bw, path, &sum)
	}
	fmt.Fprintf(bw, "%d passed, %d failed", sum.Passed, sum.Failed)
	if sum.BrokenFiles > 0 {
		fmt.Fprintf(bw, ", %d of %d files could not be run", sum.BrokenFiles, len(paths))
	}
	bw.WriteString("\n")
	if err := bw.Flush(); err != nil {
		return sum, fmt.Errorf("ruletest: write report: %w", err)
	}
	return sum, nil
}

func runFile(w io.Writer, path string, sum *Summary) {
	suite, err := Load(path)
	if err != nil {
		sum.BrokenFiles++
		fmt.Fprintf(w, "BROKEN %s\n", path)
		writeProblems(w, err)
		return
	}
	rs, err := suite.LoadRules()
	if err != nil {
		sum.BrokenFiles++
		fmt.Fprintf(w, "BROKEN %s: rule files do not load\n", path)
		writeProblems(w, err)
		return
	}
	results := suite.Run(rs)
	failed := 0
	for i := range results {
		if !results[i].Passed() {
			failed++
		}
	}
	sum.Passed += len(results) - failed
	sum.Failed += failed
	if failed == 0 {
		fmt.Fprintf(w, "ok   %s (%d tests)\n", path, len(results))
		return
	}
	fmt.Fprintf(w, "FAIL %s (%d of %d tests failed)\n", path, failed, len(results))
	for i := range results {
		r := &results[i]
		if r.Passed() {
			continue
		}
		fmt.Fprintf(w, "--- FAIL: %s (%s:%d)\n", r.Test.Name, path, r.Test.Line)
		for _, f := range r.Failures {
			for _, line := range strings.SplitAfter(strings.TrimSuffix(f, "\n"), "\n") {
				fmt.Fprintf(w, "    %s", line)
			}
			fmt.Fprintln(w)
		}
	}
}

// writeProblems lists a load error's problems, one per line, indented.
func writeProblems(w io.Writer, err error) {
	var pe *ParseError
	var le *rules.LoadError
	var problems []string
	switch {
	case errors.As(err, &pe):
		problems = pe.Problems
	case errors.As(err, &le):
		for _, p := range le.Problems {
			problems = append(problems, p.String())
		}
	default:
		problems = strings.Split(err.Error(), "\n")
	}
	for _, p := range problems {
		fmt.Fprintf(w, "    %s\n", p)
	}
}
