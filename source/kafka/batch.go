package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// consumePartition consumes one assigned partition in order until it is
// released or abandoned. abandon ends everything, the batch being applied
// included; release (derived from abandon) stops the worker only between
// batches, so that a released partition leaves nothing half applied. It
// returns the offset after the last applied message and whether that is
// exactly where the partition was left.
func (d *Daemon) consumePartition(abandon, release context.Context, tp topicPartition, w *partitionWorker) partitionResult {
	r := d.newPartitionRun(abandon, release, tp, w)
	// The first heartbeat of the membership is asked for at assignment
	// (Daemon.assigned); wait for its acknowledgement.
	if d.lease.wait(release, w.member) != nil {
		return r.res
	}
	defer r.startCommitter()()
	for first := true; ; first = false {
		opts, ok := r.nextBatch(first)
		if !ok || !r.apply(opts) || !r.applied() {
			return r.res
		}
	}
}

// partitionRun is the state of one partition's consumption
// (consumePartition), reused from batch to batch.
type partitionRun struct {
	d                *Daemon
	release, guarded context.Context
	tp               topicPartition
	w                *partitionWorker
	log              *slog.Logger
	res              partitionResult
	// live tells whether the membership the partition was assigned to is
	// surely live (memberLease): nothing reaches memcached otherwise. It
	// is checked before each batch, and by the writers (guarded) before
	// each round or op they send.
	live func() error
	b    pipeline.Batch
	src  batchSource
	// msgs is reused; it is cleared after each batch so that it does not
	// pin message values.
	msgs []pipeline.Message
	// taken is when the previous batch was closed: messages fetched
	// since then have waited for this one.
	taken time.Time
	// expect is the offset the next message should have: the committed
	// offset, then the one after the last applied message; -1 while
	// unknown.
	expect int64
	c      *offsetCommitter
}

func (d *Daemon) newPartitionRun(abandon, release context.Context, tp topicPartition, w *partitionWorker) *partitionRun {
	r := &partitionRun{d: d, release: release, tp: tp, w: w,
		log: d.log.With("topic", tp.topic, "partition", tp.partition),
		res: partitionResult{next: -1, clean: true, first: -1},
		src: batchSource{q: w.q}, msgs: make([]pipeline.Message, 0, d.cfg.MaxEvents), taken: time.Now(), expect: -1}
	r.live = func() error { return d.lease.check(w.member, time.Now()) }
	r.guarded = cacheops.WithGuard(abandon, r.live)
	r.c = newOffsetCommitter(func(next int64) error {
		if err := r.live(); err != nil {
			return err
		}
		return d.committer.commit(release, tp.topic, tp.partition, next, commitConsuming)
	}, func(err error, attempt int) {
		d.m.commitRetries.Inc()
		if retry.Logged(attempt - 1) {
			r.log.Warn("committing offset failed; retrying, the partition applies at most batch.max_events past its commit meanwhile",
				"attempt", attempt, "error", err.Error())
		}
	})
	return r
}

// startCommitter runs the offset committer beside the batches and returns
// the function that stops it.
func (r *partitionRun) startCommitter() (stop func()) {
	commitCtx, stopCommitting := context.WithCancel(r.release)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.c.run(commitCtx)
	}()
	return func() {
		stopCommitting()
		<-done
	}
}

// failed reports a fetch failure unless the partition is being released,
// then waits for the release.
func (r *partitionRun) failed(err error) {
	if r.release.Err() == nil {
		r.d.fetchFailed(r.log, r.tp, err, &r.w.progress)
		<-r.release.Done()
	}
}

// nextBatch fills r.msgs with the next batch and returns how to coalesce
// it; ok is false when the partition stops.
func (r *partitionRun) nextBatch(first bool) (opts pipeline.CoalesceOptions, ok bool) {
	d := r.d
	// Messages applied beyond the committed offset stay at most
	// MaxEvents: after a crash the first batch of the partition's next
	// owner covers that many (Config.MaxWait) and turns their counter
	// deltas into recounts. Commits run beside the batches, one at a
	// time, each for the latest applied offset, so that a slow group
	// coordinator holds a partition back only once a full batch's worth
	// is waiting for it.
	room, err := r.c.room(r.release, d.cfg.MaxEvents)
	if err != nil {
		return opts, false // released
	}
	if first && len(r.src.pending) == 0 {
		// Fetching starts once the partition's committed offset (and so
		// its previous owner's handoff marker) is known.
		if _, err := r.src.receive(r.release, nil); err != nil {
			r.failed(err)
			return opts, false
		}
	}
	if first {
		if opts, ok = r.firstBatchOptions(); !ok {
			return opts, false
		}
	}
	r.msgs, r.taken, err = d.fill(r.release, &r.src, r.msgs[:0], room, opts.Recount, r.taken, &r.w.progress)
	if err != nil {
		r.failed(err)
		return opts, false
	}
	if first {
		r.res.first = r.msgs[0].Pos.Offset
		r.c.begin(r.msgs[0].Pos.Offset)
		if co, found := d.committedOffset(r.tp); found {
			r.expect = co.offset
		}
	}
	// Records the partition's log lost before they were read: bump the
	// fallback namespaces of the topic's tables before going on.
	at := r.msgs[0].Pos.Offset
	if gap, reason := logGap(r.expect, at, r.src.logStart); gap {
		r.log.Error("records of the partition were never read: "+reason+"; bumping the fallback namespaces of the topic's tables",
			"expected_offset", r.expect, "first_offset", at, "log_start", r.src.logStart)
		if !d.coverGap(r.guarded, r.release, r.log, r.w.member, r.tp.topic, gapReason(r.expect, at), r.msgs[0].Pos) {
			r.res.clean = false
			return opts, false
		}
		opts.Recount = true // deltas around a gap cannot be trusted
	}
	return opts, true
}

// firstBatchOptions decides how the partition's first batch is coalesced
// and replaces the previous owner's handoff marker after a clean handoff;
// ok is false when the partition was released meanwhile.
func (r *partitionRun) firstBatchOptions() (opts pipeline.CoalesceOptions, ok bool) {
	// After a crash the previous owner may have applied messages past
	// its last commit without committing them: the first batch turns
	// their counter deltas into recounts. After a clean handoff nothing
	// past the commit was applied.
	opts.Recount = !r.d.handedOff(r.tp)
	// A partition that was owned before (it has a commit) and not handed
	// off cleanly may also get set tokens late from its previous owner
	// (one that stalled between its last check and its send): the first
	// batch deletes the sets it touches, as a replay does. A partition
	// without any commit starts afresh.
	co, found := r.d.committedOffset(r.tp)
	opts.ResetSets = opts.Recount && found
	r.log.Debug("partition starts", "offset", r.src.pending[0].Pos.Offset, "committed", co.offset, "found", found,
		"handed_off", co.handedOff, "recount_first_batch", opts.Recount, "reset_sets", opts.ResetSets)
	if !opts.Recount && r.d.replaceHandoffMarker(r.release, r.log, r.tp, co.offset, r.live) != nil {
		return opts, false // released
	}
	return opts, true
}

// apply applies the batch until it is applied, or reports false when the
// partition must stop. While the membership may have expired it sends
// nothing more of the batch, commits nothing, and waits: either the
// client learns that the partition is lost (abandon, release), or a
// heartbeat of this membership is acknowledged again and the batch is
// applied again from the start, as after a crash (part of it may have
// been sent).
func (r *partitionRun) apply(opts pipeline.CoalesceOptions) bool {
	msgs := r.msgs
	for {
		err := r.live()
		if err == nil {
			err = r.d.p.Process(r.guarded, &r.b, msgs, opts)
		}
		if err == nil {
			return true
		}
		r.res.clean = false
		if !errors.Is(err, ErrMembershipExpired) {
			r.log.Debug("batch abandoned uncommitted", "messages", len(msgs), "from_offset", msgs[0].Pos.Offset, "reason", err.Error())
			return false
		}
		r.d.m.abandoned.Inc()
		r.log.Warn("group membership may have expired; batch abandoned, nothing more of it sent, nothing committed",
			"messages", len(msgs), "from_offset", msgs[0].Pos.Offset, "reason", err.Error())
		if r.d.lease.wait(r.release, r.w.member) != nil {
			return false
		}
		r.log.Info("group membership confirmed again; applying the abandoned batch again, recounting", "from_offset", msgs[0].Pos.Offset)
		opts = pipeline.CoalesceOptions{Recount: true, ResetSets: true}
	}
}

// applied records an applied batch: the offset to commit, progress, lag.
// It reports false when the partition stops (a stuck record batch, or a
// release).
func (r *partitionRun) applied() bool {
	next := r.msgs[len(r.msgs)-1].Pos.Offset + 1
	r.res.next, r.expect = next, next
	r.c.applied(next)
	r.w.progress.advanced(len(r.src.pending) > 0 || r.src.more())
	defer r.b.Release()
	if ob := stuckBatch(r.msgs); ob != nil {
		// Committed past the batch; the client fetches nothing more of
		// the partition in this assignment.
		clear(r.msgs)
		r.d.fetchFailed(r.log, r.tp, ob.StuckError(), &r.w.progress)
		<-r.release.Done()
		return false
	}
	// Messages between the batch's last one and the last stable offset
	// of the latest fetch.
	r.d.m.setLag(r.tp.topic, r.tp.partition, max(r.src.stable-next, 0))
	clear(r.msgs) // do not pin message values until the next batch fills
	return r.release.Err() == nil
}

// coverGap bumps the fallback namespaces of topic's tables for records
// its partition lost before they were read (Pipeline.CoverGap). When the
// write guard refuses because member's session may have expired, nothing
// more is sent and, as for a batch, it waits for the lease and tries
// again. It reports false when the partition must stop: guarded or
// release ended.
func (d *Daemon) coverGap(guarded, release context.Context, log *slog.Logger, member, topic, reason string, at rules.Position) bool {
	var covered bool
	for {
		var err error
		covered, err = d.p.CoverGap(guarded, topic, reason, at)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrMembershipExpired) {
			return false
		}
		d.m.abandoned.Inc()
		log.Warn("group membership may have expired; fallback bumps of the gap abandoned, nothing more of them sent, nothing committed",
			"reason", err.Error())
		if d.lease.wait(release, member) != nil {
			return false
		}
	}
	if !covered {
		log.Error("no rule file of the topic's tables has a fallback namespace: keys of the lost changes may serve stale data until they expire")
	}
	return true
}

// replaceHandoffMarker commits offset, the partition's handoff commit
// (commitHandedOff), again as commitConsuming before anything past it is
// applied: the marker tells the next owner that nothing past the offset
// was applied, which stops being true with this owner's first batch. If
// this owner then crashed or stalled before its own first commit, the
// next owner would take the partition as handed off and apply again the
// counter deltas applied here. Failed commits are retried with backoff
// until ctx ends, whose error it then returns.
func (d *Daemon) replaceHandoffMarker(ctx context.Context, log *slog.Logger, tp topicPartition, offset int64, live func() error) error {
	for attempt := 1; ; attempt++ {
		err := live()
		if err == nil {
			err = d.committer.commit(ctx, tp.topic, tp.partition, offset, commitConsuming)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.m.commitRetries.Inc()
		if retry.Logged(attempt - 1) {
			log.Warn("replacing the handoff marker before applying failed; retrying, the partition waits", "offset", offset,
				"attempt", attempt, "error", err.Error())
		}
		if err := retry.Sleep(ctx, commitBackoff(attempt)); err != nil {
			return err
		}
	}
}

// logGap reports whether records between expect (the next offset
// expected, -1 unknown) and the first message fetched were lost from the
// log before they were read, and why.
func logGap(expect, first, logStart int64) (bool, string) {
	switch {
	case expect < 0:
		return false, ""
	case logStart > expect && first > expect:
		return true, fmt.Sprintf("offsets %d to %d were removed by retention", expect, logStart-1)
	case first < expect:
		return true, fmt.Sprintf("the log restarts at %d, before the committed offset %d (a recreated or truncated topic)", first, expect)
	}
	return false, ""
}

// gapReason names a gap for cachewarden_invalidations_lost_total.
func gapReason(expect, first int64) string {
	if first < expect {
		return pipeline.LostOffsetReset
	}
	return pipeline.LostRetention
}

// handedOff reports whether partition tp's previous owner released it
// cleanly (see commitHandedOff).
func (d *Daemon) handedOff(tp topicPartition) bool {
	c, ok := d.committedOffset(tp)
	return ok && c.handedOff
}

// fill appends the next batch of messages to msgs: it waits for one
// message, then takes more until limit or until MaxWait has passed
// since the first one became available, and returns the batch and when
// it was closed. A first message that was already waiting when fill was
// called counts as available since prevTaken, when the previous batch was
// closed: while that batch was applied and committed, the messages behind
// it have been waiting already, and holding the next batch open for a
// full MaxWait more would add the time of every apply to their latency.
// The first batch after an assignment that recounts waits for more
// instead (see Config.MaxWait): until the partition's end as the fetch responses
// report it, MaxEvents, or max(MaxWait, 2s).
func (d *Daemon) fill(ctx context.Context, src *batchSource, msgs []pipeline.Message, limit int, first bool, prevTaken time.Time, progress *progressClock) ([]pipeline.Message, time.Time, error) {
	called := time.Now()
	if len(src.pending) == 0 {
		if _, err := src.receive(ctx, nil); err != nil {
			return msgs, time.Now(), err
		}
	}
	progress.waiting()
	msgs, end := src.take(msgs, limit-len(msgs), first)
	if end || len(msgs) == limit {
		return msgs, time.Now(), nil
	}
	opened := time.Now()
	if opened.Sub(called) < waitingThreshold {
		opened = prevTaken // the messages were fetched already
	}
	wait := d.cfg.MaxWait
	if first {
		wait = max(wait, firstBatchWait)
	}
	// At least a quarter of MaxWait remains to take the waiting messages:
	// a batch behind a slow one must not shrink to a few messages, or
	// the partition would fall further behind.
	closeAt := later(opened.Add(wait), time.Now().Add(wait/4))
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for len(msgs) < limit {
		if len(src.pending) == 0 {
			if timer == nil {
				timer = time.NewTimer(time.Until(closeAt))
			}
			ok, err := src.receive(ctx, timer.C)
			if err != nil {
				return msgs, time.Now(), err
			}
			if !ok {
				break // the batch's time is up
			}
		}
		if msgs, end = src.take(msgs, limit-len(msgs), first); end {
			break
		}
	}
	return msgs, time.Now(), nil
}

// stuckBatch returns the oversized batch among msgs the client could not
// move past (OversizedBatch.Stuck); nil when none.
func stuckBatch(msgs []pipeline.Message) *OversizedBatch {
	for i := range msgs {
		if ob, ok := msgs[i].Failed.(*OversizedBatch); ok && ob.Stuck {
			return ob
		}
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// waitingThreshold tells messages that were fetched already (taking them
// takes microseconds) from messages fill had to wait for. A slow return misjudged as waiting only keeps the batch open for
// the full MaxWait.
const waitingThreshold = time.Millisecond
