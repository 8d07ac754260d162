package decode

import (
	"fmt"
	"slices"

	"github.com/cachewarden/cachewarden/rules"
)

// PlanMessage plans every row change of one decoded message, appending to
// dst the ops of the rows that plan cleanly: a row that fails does not
// hold back the others (they are applied, and the message still counts as
// poison). It is the one per-message planning step of the daemon, replay
// and `plan`. rowDone, when not nil, is called after each row with the
// number of ops it added and its error, labelled with the row's place in a
// multi-row message. It returns the first such error.
func PlanMessage(rs *rules.RuleSet, events []rules.Event, dst []rules.Op, stats *rules.PlanStats, rowDone func(i, added int, err error)) ([]rules.Op, error) {
	var first error
	startLen := len(dst)
	for i := range events {
		before := len(dst)
		if i == 1 {
			// Room for as many ops per row as the first row planned, at
			// once, rather than growing by a quarter at a time through a
			// message of many rows.
			dst = slices.Grow(dst, (len(events)-1)*max(1, len(dst)-startLen))
		}
		ops, st, err := rs.Plan(dst, &events[i])
		stats.Add(st)
		if err != nil {
			ops = ops[:before]
			if len(events) > 1 {
				err = fmt.Errorf("row %d of %d (%s.%s): %w", i+1, len(events), events[i].Database, events[i].Table, err)
			}
			if first == nil {
				first = err
			}
		}
		dst = ops
		if rowDone != nil {
			rowDone(i, len(dst)-before, err)
		}
	}
	return dst, first
}
