package verify

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteText writes the report for people: one line per mismatch, a table
// of rules, the skipped rules with the reason, and a summary line such as
//
//	checked 240, present 235 (97.9%), missing 5, consistent 235, wrong 0: consistency 100.000% (all)
//
// and a warning when no checked item was present, since such a check
// proves nothing.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	for _, m := range r.Mismatches {
		ew.printf("MISMATCH rule=%s key=%s cached=%s truth=%s\n", m.Rule, m.Key, m.Cached, m.Truth)
	}
	if r.Dropped > 0 {
		ew.printf("(%d more mismatches not listed)\n", r.Dropped)
	}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tKIND\tLISTED\tCHECKED\tMISSING\tCONSISTENT\tWRONG")
	var skipped []RuleReport
	for _, rr := range r.Rules {
		if rr.Skipped != "" {
			skipped = append(skipped, rr)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", rr.Rule, rr.Kind, rr.Listed, rr.Checked, rr.Missing, rr.Consistent, rr.Wrong)
	}
	if err := tw.Flush(); err != nil && ew.err == nil {
		ew.err = err
	}
	for _, rr := range skipped {
		ew.printf("skipped %s (%s): %s\n", rr.Rule, rr.Kind, rr.Skipped)
	}
	ew.printf("checked %d, present %d (%s), missing %d, consistent %d, wrong %d: consistency %s\n",
		r.Checked, r.Present(), r.presentShare(), r.Missing, r.Consistent, r.Wrong, r.ConsistencyText())
	if r.Present() == 0 {
		ew.printf("warning: no checked item was present in memcached, so this check proves nothing; are the servers, memcached.distribution and the rules' prefix the applications' ones?\n")
	}
	return ew.err
}

// errWriter keeps the first write error so that a report is written with
// one check at the end.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}

// presentShare renders the share of checked items that were present.
func (r *Report) presentShare() string {
	if r.Checked == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(r.Present())/float64(r.Checked))
}
