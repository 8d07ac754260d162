package check

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Severity says whether a finding fails the check.
type Severity string

const (
	// Error is a mistake the daemon would trip over: the check fails.
	Error Severity = "error"
	// Warning is something that works but costs or surprises (a full
	// table scan, a hashed key, a key whose text depends on the CDC
	// producer): the check fails only with Report.Failed(true).
	Warning Severity = "warning"
)

// Finding is one problem, located in the config, rule or rule test file
// that causes it.
type Finding struct {
	// File, Line and Column locate the problem; Line and Column are
	// 1-based, 0 when unknown (Column alone, or both, for problems of a
	// whole file or of the database connection).
	File   string `json:"file,omitempty"`
	Line   int    `json:"line,omitempty"`
	Column int    `json:"column,omitempty"`
	// Severity is Error or Warning.
	Severity Severity `json:"severity"`
	// Rule names the rule concerned; "" for config and test problems.
	Rule string `json:"rule,omitempty"`
	// Message says what is wrong, where and why, on one line.
	Message string `json:"message"`
}

// String formats f as "file:line:col: severity: message", leaving out
// the parts of the position that are unknown.
func (f Finding) String() string {
	var b strings.Builder
	if f.File != "" {
		b.WriteString(f.File)
		if f.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(f.Line))
			if f.Column > 0 {
				b.WriteByte(':')
				b.WriteString(strconv.Itoa(f.Column))
			}
		}
		b.WriteString(": ")
	}
	b.WriteString(string(f.Severity))
	b.WriteString(": ")
	b.WriteString(oneLine(f.Message))
	return b.String()
}

// oneLine joins the lines of a multi-line message with "; ", so that each
// finding stays one line of output.
func oneLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if !strings.Contains(s, "\n") {
		return s
	}
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteByte(' ')
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

// sortFindings orders findings by file, line and column, keeping the
// order of findings at the same place.
func sortFindings(fs []Finding) {
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}

// Report is the outcome of Run.
type Report struct {
	// Findings are every problem found, config first, then rules, rule
	// tests and the schema; within each, by file and position.
	Findings []Finding `json:"findings"`
	// Rules and RuleFiles count the loaded rules and their files.
	Rules     int `json:"rules"`
	RuleFiles int `json:"rule_files"`
	// TestFiles, TestsPassed and TestsFailed count the rule tests run.
	TestFiles   int `json:"test_files"`
	TestsPassed int `json:"tests_passed"`
	TestsFailed int `json:"tests_failed"`
	// Server names the server and user of the DSN (never the password);
	// "" when the schema was not checked.
	Server string `json:"server,omitempty"`
	// SchemaSkipped says why a schema that was asked for (--dsn or
	// --config-dsn) was not checked; "" when it was, or when none was
	// asked for.
	SchemaSkipped string `json:"schema_skipped,omitempty"`
	// Schemas lists the databases whose tables the rules were checked
	// against.
	Schemas []string `json:"schemas,omitempty"`
	// Errors and Warnings count the findings of each severity.
	Errors   int `json:"errors"`
	Warnings int `json:"warnings"`
}

func (r *Report) add(fs ...Finding) {
	for _, f := range fs {
		switch f.Severity {
		case Error:
			r.Errors++
		case Warning:
			r.Warnings++
		}
		r.Findings = append(r.Findings, f)
	}
}

// Failed reports whether the check failed: some finding is an error, or,
// with warningsFail, a warning.
func (r *Report) Failed(warningsFail bool) bool {
	return r.Errors > 0 || (warningsFail && r.Warnings > 0)
}

// WriteText writes one line per finding, then a summary line that does
// not start with a file name.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, f := range r.Findings {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "check: %s in %s", plural(r.Rules, "rule"), plural(r.RuleFiles, "file"))
	if r.TestFiles > 0 {
		fmt.Fprintf(&b, ", %s in %s (%d failed)", plural(r.TestsPassed+r.TestsFailed, "rule test"), plural(r.TestFiles, "test file"), r.TestsFailed)
	}
	switch {
	case r.SchemaSkipped != "":
		fmt.Fprintf(&b, ", schema not checked (%s)", r.SchemaSkipped)
	case r.Server == "":
		b.WriteString(", no schema (no --dsn)")
	case len(r.Schemas) > 0:
		fmt.Fprintf(&b, ", schema on %s (%s)", r.Server, strings.Join(r.Schemas, ", "))
	default:
		fmt.Fprintf(&b, ", schema on %s", r.Server)
	}
	fmt.Fprintf(&b, ": %s, %s\n", plural(r.Errors, "error"), plural(r.Warnings, "warning"))
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON object: findings (file, line,
// column, severity, rule, message), the counts and the schemas checked.
func (r *Report) WriteJSON(w io.Writer) error {
	out := *r
	if out.Findings == nil {
		out.Findings = []Finding{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(&out)
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
