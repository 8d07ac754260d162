package pipeline

import (
	"context"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// ChangeObserver watches a share of the ops the pipeline applies
// (*observer.Observer). BeforeApply is called with a batch's ops before
// they are applied; when it returns a function, that is called with the
// same ops and their results once the batch has been applied.
// SetPartitionCounts is told how many partitions each topic has, for the
// counters it judges at a binary log position.
type ChangeObserver interface {
	BeforeApply(ctx context.Context, ops []rules.Op) func(ops []rules.Op, results []cacheops.Result)
	SetPartitionCounts(counts map[string]int)
}

// observeOnly is the applier of `cachewarden observe`: it writes nothing
// and reports every op as done, so that the observer checks what another
// daemon applies.
type observeOnly struct{}

func (observeOnly) Apply(_ context.Context, ops []rules.Op, results []cacheops.Result) error {
	for i := range ops {
		results[i] = cacheops.Result{Outcome: cacheops.OutcomeMissing}
	}
	return nil
}

// droppingApplier loses the ops drop selects, reporting them applied, as
// an invalidation lost between the daemon and memcached would be
// (StackOptions.DropOps).
type droppingApplier struct {
	Applier
	drop func(*rules.Op) bool
}

func (d droppingApplier) Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error {
	var keep []rules.Op
	var at []int
	for i := range ops {
		if d.drop(&ops[i]) {
			results[i] = cacheops.Result{Outcome: cacheops.OutcomeIncr}
			continue
		}
		keep = append(keep, ops[i])
		at = append(at, i)
	}
	if len(keep) == len(ops) {
		return d.Applier.Apply(ctx, ops, results)
	}
	res := make([]cacheops.Result, len(keep))
	err := d.Applier.Apply(ctx, keep, res)
	for j, i := range at {
		results[i] = res[j]
	}
	return err
}
