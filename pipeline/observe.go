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
