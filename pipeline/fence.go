package pipeline

import (
	"context"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/rules"
)

// DeltaFencer checks counter deltas against the fences that recounts leave
// (docs/exact-counters.md); *counters.Counters is one.
//
// CheckDeltas runs on a batch's planned ops before coalescing, which sums
// deltas per key and so loses their binary log positions: it drops the
// deltas that a recount already includes and turns those of counters in
// doubt into recounts. RecheckDeltas runs after the coalesced ops were
// applied and returns the recounts needed where a recount raced with the
// batch's increments.
type DeltaFencer interface {
	CheckDeltas(ctx context.Context, d *counters.DeltaFence, ops []rules.Op) ([]rules.Op, error)
	RecheckDeltas(ctx context.Context, d *counters.DeltaFence, dst, ops []rules.Op, results []cacheops.Result) ([]rules.Op, error)
}

// batchFence is a Batch's fence state, from checkFences to recheckFences.
type batchFence struct {
	// checked is set when the batch's deltas were checked, so that the
	// batch's Apply rechecks them.
	checked bool
	fence   counters.DeltaFence
	// recounts applies the recounts the recheck asks for.
	recounts *Batch
}

// checkFences filters b.planned against the fences (DeltaFencer). Nothing
// to do without Config.Fences, or with opts.Recount (every delta
// becomes a recount anyway). The fences are read from memcached: while it
// fails the partition waits, retrying with backoff, as applying would; an
// error no retry can cure (a malformed key: its op fails when applied)
// leaves the batch unfiltered. It returns only ctx's error.
func (p *Pipeline) checkFences(ctx context.Context, b *Batch, opts CoalesceOptions) error {
	if p.cfg.Fences == nil || opts.Recount {
		return nil
	}
	var kept []rules.Op
	ok, err := p.retryFences(ctx, func() (err error) {
		kept, err = p.cfg.Fences.CheckDeltas(ctx, &b.fence.fence, b.planned)
		return err
	}, "cannot check counter deltas against their fences; applying them unchecked",
		"cannot read counter fences; retrying, the partition waits")
	if ok {
		b.planned = kept
		b.fence.checked = true
		b.Stats.Fence = b.fence.fence.Stats
	}
	return err
}

// retryFences calls read until it succeeds (true), ctx ends (its error)
// or read fails with an error no retry cures (logged as giveUp; false and
// no error). Between attempts the partition waits with backoff, each
// retry counted and logged as retrying.
func (p *Pipeline) retryFences(ctx context.Context, read func() error, giveUp, retrying string) (bool, error) {
	for attempt := 0; ; attempt++ {
		err := read()
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if !cacheops.Retryable(err) {
			p.log.Error(giveUp, "error", err.Error())
			return false, nil
		}
		p.m.applyRetries.Inc()
		wait := p.backoff(attempt)
		if retry.Logged(attempt) {
			p.log.Warn(retrying, "attempt", attempt+1, "retry_in", wait, "error", err.Error())
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return false, err
		}
	}
}

// recheckFences rechecks the counters b's checked deltas were applied to
// and applies the recounts that asks for (like the batch's own ops:
// retried until they succeed or fail permanently). It returns only ctx's
// error.
func (p *Pipeline) recheckFences(ctx context.Context, b *Batch) error {
	if !b.fence.checked || p.cfg.Fences == nil {
		return nil
	}
	b.fence.checked = false
	if b.fence.recounts == nil {
		b.fence.recounts = &Batch{}
	}
	sub := b.fence.recounts
	ok, err := p.retryFences(ctx, func() (err error) {
		sub.Ops, err = p.cfg.Fences.RecheckDeltas(ctx, &b.fence.fence, sub.Ops[:0], b.Ops, b.results)
		return err
	}, "cannot recheck counter fences after applying deltas",
		"cannot reread counter fences; retrying, the partition waits")
	if !ok {
		return err
	}
	b.Stats.Fence = b.fence.fence.Stats
	if len(sub.Ops) == 0 {
		return nil
	}
	p.m.recounts.WithLabelValues("fence_recheck").Add(float64(len(sub.Ops)))
	err = p.applyOps(ctx, sub)
	clear(sub.Ops) // drop references to rules and args
	return err
}
