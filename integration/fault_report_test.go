package integration

import (
	stdflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The reliability report: every fault scenario adds a row, and when
// CACHEWARDEN_RELIABILITY_REPORT names a Markdown file (a relative path
// is taken from the repository root), TestMain rewrites the section of
// it that holds the results of the size that ran (CI or soak), between
// the markers reportMarkers returns, once the tests have run. A file
// without that section gets it appended.

// reportMarkers returns the lines that delimit the results of a size.
func reportMarkers(soak bool) (begin, end string) {
	size := "ci"
	if soak {
		size = "soak"
	}
	return "<!-- fault-suite " + size + " results: begin (written by the fault suite; do not edit) -->",
		"<!-- fault-suite " + size + " results: end -->"
}

// reliabilityRow is one scenario's line of the report.
type reliabilityRow struct {
	Scenario string
	// Events counts the row-change events published.
	Events int
	// Faults describes what was injected.
	Faults string
	// Lost counts events whose effect is missing after quiesce: expected
	// namespace bumps that did not happen, plus messages never committed.
	Lost int
	// Wrong counts items that disagree with MariaDB after quiesce.
	Wrong int
	// DriftBefore and DriftAfter are the counters found wrong after
	// quiesce with recount fencing off and on; "" when not measured.
	DriftBefore, DriftAfter string
	// Details, for the notes under the table.
	NamespacesMoved, Checked, Consistent, Missing, WrongCounters int
	VerifyCLI                                                    string
	Notes                                                        []string
	Duration                                                     time.Duration
	Passed                                                       bool
}

var report struct {
	mu   sync.Mutex
	rows []*reliabilityRow
}

// recordRow adds a scenario's row to the report; whether the scenario
// passed is read when its test ends.
func recordRow(t *testing.T, started time.Time, row *reliabilityRow) {
	t.Cleanup(func() {
		row.Passed = !t.Failed()
		row.Duration = time.Since(started).Round(time.Second)
		report.mu.Lock()
		defer report.mu.Unlock()
		report.rows = append(report.rows, row)
	})
}

func TestMain(m *testing.M) {
	code := m.Run()
	removeDaemonBinary()
	if path := os.Getenv("CACHEWARDEN_RELIABILITY_REPORT"); path != "" {
		if !filepath.IsAbs(path) {
			// Relative to the repository root, not to this package.
			path = filepath.Join("..", path)
		}
		if err := writeReport(path); err != nil {
			fmt.Fprintf(os.Stderr, "reliability report: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// reportOrder is the order of the table's rows.
var reportOrder = []string{
	scenarioKill, scenarioMemcachedStop, scenarioMemcachedRestart, scenarioMySQLOutage,
	scenarioGroup, scenarioFrozen, scenarioFrozenSlow, scenarioHostile, scenarioDrift,
}

// writeReport writes the collected rows into path.
func writeReport(path string) error {
	report.mu.Lock()
	rows := append([]*reliabilityRow(nil), report.rows...)
	report.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	rank := func(name string) int {
		for i, n := range reportOrder {
			if strings.HasPrefix(name, n) {
				return i
			}
		}
		return len(reportOrder)
	}
	for i := 1; i < len(rows); i++ { // few rows: insertion sort keeps it stable
		for j := i; j > 0 && rank(rows[j].Scenario) < rank(rows[j-1].Scenario); j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
	section := renderReport(rows)
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	begin, end := reportMarkers(faultSizesFromEnv().Soak)
	b, e := strings.Index(doc, begin), strings.Index(doc, end)
	switch {
	case b >= 0 && e > b:
		doc = doc[:b] + section + doc[e+len(end):]
	case doc == "":
		doc = "# Reliability\n\n" + section + "\n"
	default:
		doc = strings.TrimRight(doc, "\n") + "\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

func renderReport(rows []*reliabilityRow) string {
	sz := faultSizesFromEnv()
	begin, end := reportMarkers(sz.Soak)
	var b strings.Builder
	b.WriteString(begin + "\n\n")
	size := "CI size"
	if sz.Soak {
		size = "soak size"
	}
	fmt.Fprintf(&b, "Produced by `%s` (%s: %s) on %s, %d CPUs, %s, %s.\n\n",
		reportCommand(), size, sz, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
	b.WriteString("| scenario | events | faults injected | events lost | wrong items after quiesce | counter drift, fencing off → on | `cachewarden verify`: consistency of checked items | result |\n")
	b.WriteString("|---|--:|---|--:|--:|---|---|---|\n")
	for _, r := range rows {
		drift := "—"
		if r.DriftBefore != "" || r.DriftAfter != "" {
			drift = orDash(r.DriftBefore) + " → " + orDash(r.DriftAfter)
		}
		result := "pass"
		if !r.Passed {
			result = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %s | %s | %s |\n",
			r.Scenario, r.Events, mdCell(r.Faults), r.Lost, r.Wrong, drift, mdCell(consistencyOf(r.VerifyCLI)), result)
	}
	b.WriteString("\nPer scenario, after quiesce:\n\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "- **%s** (%v): %d namespace bumps checked and moved; verify checked %d sets and counters: %d present and equal to MariaDB, %d missing, %d wrong (%d of them counters).",
			r.Scenario, r.Duration, r.NamespacesMoved, r.Checked, r.Consistent, r.Missing, r.Wrong, r.WrongCounters)
		for _, n := range r.Notes {
			b.WriteString(" " + n)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n" + end)
	return b.String()
}

// reportCommand names the command that produced the report.
func reportCommand() string {
	if c := os.Getenv("CACHEWARDEN_RELIABILITY_COMMAND"); c != "" {
		return c
	}
	run := "TestFault"
	if f := stdflag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		run = f.Value.String()
	}
	env := "CACHEWARDEN_RELIABILITY_REPORT=docs/reliability.md"
	if os.Getenv("CACHEWARDEN_SOAK") == "1" {
		env = "CACHEWARDEN_SOAK=1 " + env
	}
	return fmt.Sprintf("%s go test ./integration/ -run '%s'", env, run)
}

// consistencyOf shortens the summary line of `cachewarden verify`
// ("checked 240, present 235 (97.9%), missing 5, consistent 235, wrong 0:
// consistency 100.000% (all)") to "100.000% (all) of 240".
func consistencyOf(summary string) string {
	_, c, ok := strings.Cut(summary, "consistency ")
	if !ok {
		return summary
	}
	var checked int
	if _, err := fmt.Sscanf(summary, "checked %d", &checked); err != nil {
		return c
	}
	return fmt.Sprintf("%s of %d", c, checked)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// mdCell makes text safe for a Markdown table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
