package cacheops

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// Outcome says what applying one op did.
type Outcome uint8

const (
	// OutcomeFailed: the op was not applied; Result.Err says why. It is
	// the zero value, so a Result never filled in reads as a failure.
	OutcomeFailed Outcome = iota
	// OutcomeIncr: an existing namespace was incremented.
	OutcomeIncr
	// OutcomeAdded: a missing namespace was created with the current unix
	// time in milliseconds.
	OutcomeAdded
	// OutcomeAppended: the set tokens were appended.
	OutcomeAppended
	// OutcomeCompacted: the tokens were appended and the set was rewritten
	// without its dropped tokens.
	OutcomeCompacted
	// OutcomeLoaded: the set was missing and was created from its load
	// query, whose result already includes the change.
	OutcomeLoaded
	// OutcomeMissing: the set was missing and its rule has no load query
	// (or the Applier no loader); it stays missing, which readers handle.
	OutcomeMissing
	// OutcomeDeleted: the item could not be kept correct (the load query
	// failed, the set cannot grow even after compaction, a namespace held
	// a non-numeric value) and was deleted; a missing item is correct.
	OutcomeDeleted
	// OutcomeDecr: an existing counter was decremented.
	OutcomeDecr
	// OutcomeRecounted: a counter was recounted from MySQL and stored with
	// set (a recount op, or a decr that may have been clamped at zero).
	OutcomeRecounted
	// OutcomeRecountNeeded: a counter delta found its counter missing
	// (its rule has a recount query), clamped at zero or not a number, and
	// the applier leaves the recount to its caller
	// (Config.RecountElsewhere). Err is nil; the op is not done.
	OutcomeRecountNeeded
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case OutcomeFailed:
		return "failed"
	case OutcomeIncr:
		return "incr"
	case OutcomeAdded:
		return "added"
	case OutcomeAppended:
		return "appended"
	case OutcomeCompacted:
		return "compacted"
	case OutcomeLoaded:
		return "loaded"
	case OutcomeMissing:
		return "missing"
	case OutcomeDeleted:
		return "deleted"
	case OutcomeDecr:
		return "decr"
	case OutcomeRecounted:
		return "recounted"
	case OutcomeRecountNeeded:
		return "recount_needed"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is what applying one op did. Err is non-nil exactly when Outcome
// is OutcomeFailed.
type Result struct {
	Outcome Outcome
	Err     error
}

func failedResult(err error) Result { return Result{Outcome: OutcomeFailed, Err: err} }

// ApplyError is the error of an Apply in which ops failed. It unwraps to
// every op's error, so errors.Is, errors.As and Retryable see them all.
type ApplyError struct {
	// Ops is the number of ops in the Apply.
	Ops int
	// Errs are the failed ops' errors, in op order.
	Errs []error
}

// applyErrorsShown bounds how many op errors ApplyError.Error spells out.
const applyErrorsShown = 3

func (e *ApplyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cacheops: %d of %d ops failed: ", len(e.Errs), e.Ops)
	for i, err := range e.Errs {
		if i == applyErrorsShown {
			fmt.Fprintf(&b, "; and %d more", len(e.Errs)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *ApplyError) Unwrap() []error { return e.Errs }

// ResultsError returns nil when every op succeeded (results[i] is the
// result of ops[i]), else an *ApplyError joining the failures: what an
// applier's Apply returns.
func ResultsError(ops []rules.Op, results []Result) error {
	var errs []error
	for i := range ops {
		if results[i].Err != nil {
			errs = append(errs, results[i].Err)
		}
	}
	if errs != nil {
		return &ApplyError{Ops: len(ops), Errs: errs}
	}
	return nil
}
