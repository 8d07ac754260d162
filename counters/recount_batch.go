package counters

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Recounts of one Apply, together (docs/exact-counters.md, "Cost").
//
// A fenced recount takes, per counter, a gets, the snapshot's statements,
// a set of the fence and a cas (or add) of the value: three memcached
// round trips of its own. The recounts an Apply is given (a batch's
// misses, clamped decrs and reassignment recounts) run the same steps,
// key by key in the same order, but each step for all of them at once:
// one gets of every counter, the counts (which share snapshots, see
// snapshotAsks), the fences, then the values. With Config.Servers the
// fences and the values each go in one pipelined exchange per server;
// without, one request each over the text protocol. Per counter nothing
// changes: its fence is stored before its value, and its value with cas
// over what its gets read (add when missing), so a delta that lands in
// between fails the store and the counter is recounted again
// (recountExact), as when it was recounted alone.

// minBatchRecounts is the fewest recounts Apply runs together; a single
// one takes the same round trips on its own.
const minBatchRecounts = 2

// batchedRecount is one recount of applyRecounts.
type batchedRecount struct {
	i     int // index into the Apply's ops and results
	op    *rules.Op
	cur   *memcache.Item // the counter as the gets found it; nil: missing
	n     int64
	fence Fence
	err   error // the recount failed
	// stored is the store's error (nil: stored).
	stored error
	done   bool
}

// batchable returns the indexes of the recounts Apply runs together:
// OpRecount ops with a recount query and a valid key that no other op of
// ops names (ops of one key run in slice order, one after the other).
func (c *Counters) batchable(ops []rules.Op) []int {
	if c.fence.snap == nil || c.rc == nil || c.fence.state.Load() == fencingOff {
		return nil
	}
	n := 0
	for i := range ops {
		if ops[i].Kind == rules.OpRecount {
			n++
		}
	}
	if n < minBatchRecounts {
		return nil
	}
	seen := make(map[string]int, len(ops))
	for i := range ops {
		seen[ops[i].Key]++
	}
	idx := make([]int, 0, n)
	for i := range ops {
		op := &ops[i]
		if op.Kind != rules.OpRecount || op.Rule == nil || op.Rule.Query == "" || seen[op.Key] != 1 {
			continue
		}
		if itemformat.CheckKey(op.Key) != nil {
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) < minBatchRecounts {
		return nil
	}
	return idx
}

// applyRecounts recounts ops[i] for every i of idx, together (see above),
// and fills results[i].
func (c *Counters) applyRecounts(ctx context.Context, ops []rules.Op, results []cacheops.Result, idx []int) {
	rs := make([]batchedRecount, len(idx))
	keys := make([]string, len(idx))
	for j, i := range idx {
		rs[j] = batchedRecount{i: i, op: &ops[i]}
		keys[j] = ops[i].Key
	}
	if err := ctx.Err(); err != nil {
		for _, r := range rs {
			results[r.i] = failed(fmt.Errorf("counters: recount %q: %w", r.op.Key, err))
		}
		return
	}
	// 1. The counters with their cas ids, before the snapshots.
	items, err := c.getMulti(keys)
	if err != nil {
		err = fmt.Errorf("counters: gets %d counters: %w", len(keys), err)
		for _, r := range rs {
			results[r.i] = failed(err)
		}
		return
	}
	for j := range rs {
		rs[j].cur = items[rs[j].op.Key]
	}
	// 2. The counts.
	c.countRecounts(ctx, rs)
	for j := range rs {
		if r := &rs[j]; r.err != nil {
			r.done = true
			results[r.i] = c.recountFailed(ctx, r.op, r.err)
		}
	}
	// 3. The fences, 4. the values.
	c.storeFences(ctx, rs, results)
	c.storeValues(ctx, rs)
	// 5. The outcomes; a store that lost goes the way of recountExact's.
	if lost := storedOutcomes(rs, results); len(lost) > 0 {
		c.settleLost(ctx, lost, results)
	}
}

// countRecounts counts rs (their n, fence and err): in one snapshot when
// the database takes them together, else as concurrent asks (which share
// snapshots).
func (c *Counters) countRecounts(ctx context.Context, rs []batchedRecount) {
	b, ok := c.fence.snap.(SnapshotBatchCounter)
	if !ok {
		c.recountEach(ctx, rs)
		return
	}
	c.recounts.Add(uint64(len(rs)))
	qs := make([]SnapshotQuery, len(rs))
	for j := range rs {
		qs[j] = SnapshotQuery{Query: rs[j].op.Rule.Query, Args: rs[j].op.Args}
	}
	counts, errs := b.CountAllInSnapshot(ctx, qs, SnapshotOptions{GTID: c.fence.wantGTID.Load()})
	for j := range rs {
		r := &rs[j]
		var avoid []uint32
		if r.cur != nil {
			avoid = append(avoid, r.cur.Flags)
		}
		r.n, r.fence, r.err = c.snapshotRecount(ctx, counts[j], errs[j], avoid...)
	}
}

// recountFailed is the result of op, whose recount failed with err: the
// failure when ctx ended or the guard refused the write, else the
// counter's deletion, since whatever it holds now may be wrong.
func (c *Counters) recountFailed(ctx context.Context, op *rules.Op, err error) cacheops.Result {
	if ctx.Err() != nil || errors.Is(err, cacheops.ErrWriteRefused) {
		return failed(fmt.Errorf("counters: recount %q: %w", op.Key, err))
	}
	c.log.Warn("counter recount failed; deleting the counter", "key", op.Key, "rule", op.Rule.Name,
		"retryable", cacheops.Retryable(err), "err", err)
	return c.deleteItem(op.Key, "recount")
}

// storedOutcomes fills the results of the recounts of rs not yet done
// from their stores, and returns those whose fenced store lost to
// another writer.
func storedOutcomes(rs []batchedRecount, results []cacheops.Result) (lost []*batchedRecount) {
	for j := range rs {
		r := &rs[j]
		if r.done {
			continue
		}
		switch err := r.stored; {
		case err == nil:
			results[r.i] = cacheops.Result{Outcome: cacheops.OutcomeRecounted}
		case r.fence.ID != 0 && (errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCacheMiss)):
			lost = append(lost, r)
		default:
			results[r.i] = failed(fmt.Errorf("counters: store %q: %w", r.op.Key, err))
		}
	}
	return lost
}

// settleLost fills the results of the recounts whose store lost: done
// when another recount at a snapshot no older than theirs stored first,
// else counted again as recountExact does.
func (c *Counters) settleLost(ctx context.Context, lost []*batchedRecount, results []cacheops.Result) {
	lostKeys := make([]string, len(lost))
	for j, r := range lost {
		lostKeys[j] = r.op.Key
	}
	views := make(map[string]FenceView, len(lost))
	if err := c.viewFences(lostKeys, views, nil); err != nil {
		for _, r := range lost {
			results[r.i] = failed(err)
		}
		return
	}
	for _, r := range lost {
		// As in recountExact: another recount at a snapshot no older
		// than ours stored first (done), or a delta landed, or the
		// pair only looks like ours (count again).
		if v := views[r.op.Key]; v.Consistent() && v.Fence != r.fence {
			if order, ok := ComparePositions(v.Fence.At, r.fence.At); ok && order >= 0 {
				results[r.i] = cacheops.Result{Outcome: cacheops.OutcomeRecounted}
				continue
			}
		}
		c.log.Debug("counter changed during its recount; counting again", "key", r.op.Key, "rule", r.op.Rule.Name)
		res, err := c.recountExactN(ctx, r.op, maxExactAttempts-1)
		if err != nil {
			res = c.recountFailed(ctx, r.op, err)
		}
		results[r.i] = res
	}
}

// recountEach recounts rs concurrently (at most MaxConcurrency at a time).
func (c *Counters) recountEach(ctx context.Context, rs []batchedRecount) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, c.cfg.MaxConcurrency)
	for j := range rs {
		r := &rs[j]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var avoid []uint32
			if r.cur != nil {
				avoid = append(avoid, r.cur.Flags)
			}
			r.n, r.fence, r.err = c.recountAt(ctx, r.op.Rule.Query, r.op.Args, avoid...)
		})
	}
	wg.Wait()
}

// storeFences stores the fences of the recounts that have one; a recount
// whose fence could not be stored fails (its value is not stored).
func (c *Counters) storeFences(ctx context.Context, rs []batchedRecount, results []cacheops.Result) {
	var todo []*batchedRecount
	for j := range rs {
		if r := &rs[j]; !r.done && r.fence.ID != 0 {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return
	}
	exp := int64(c.expiration(c.fence.ttl))
	errs := c.storeAll(ctx, len(todo), func(j int) (metaproto.Cmd, *memcache.Item) {
		r := todo[j]
		it := &memcache.Item{Key: FenceKey(r.op.Key), Value: encodeFence(r.fence), Expiration: int32(exp)}
		return metaproto.Cmd{Verb: metaproto.VerbSet, Key: it.Key, Data: string(it.Value), TTL: exp, HasTTL: exp > 0}, it
	}, func(it *memcache.Item) error { return c.set(it) })
	for j, r := range todo {
		if errs[j] != nil {
			r.done = true
			results[r.i] = failed(fmt.Errorf("counters: set fence of %q: %w", r.op.Key, errs[j]))
		}
	}
}

// storeValues stores the counted values: cas over the counter the gets
// read, add when it was missing, and set when the count has no fence (the
// database could not name the snapshot's position: as without fences).
func (c *Counters) storeValues(ctx context.Context, rs []batchedRecount) {
	var todo []*batchedRecount
	for j := range rs {
		if r := &rs[j]; !r.done {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return
	}
	errs := c.storeAll(ctx, len(todo), func(j int) (metaproto.Cmd, *memcache.Item) {
		r := todo[j]
		it := c.counterItem(r.op.Key, r.n, r.fence, r.op.Rule.TTL)
		cmd := metaproto.Cmd{Verb: metaproto.VerbSet, Key: it.Key, Data: string(it.Value), Flags: it.Flags,
			TTL: int64(it.Expiration), HasTTL: it.Expiration > 0}
		switch {
		case r.fence.ID == 0:
		case r.cur != nil:
			it.CasID, cmd.CAS = r.cur.CasID, r.cur.CasID
		default:
			cmd.Mode = metaproto.ModeAdd
		}
		return cmd, it
	}, func(it *memcache.Item) error {
		switch {
		case it.Flags == 0:
			return c.set(it)
		case it.CasID != 0:
			return c.cas(it)
		}
		return c.add(it)
	})
	for j, r := range todo {
		r.stored = errs[j]
	}
}

// storeAll sends n stores, made by mk: in one pipelined exchange per
// server with Config.Servers, else one text request each (store). It
// returns one error per store, nil when stored, with gomemcache's
// ErrCASConflict, ErrNotStored and ErrCacheMiss for the stores a cas or
// add did not make.
func (c *Counters) storeAll(ctx context.Context, n int, mk func(int) (metaproto.Cmd, *memcache.Item), store func(*memcache.Item) error) []error {
	errs := make([]error, n)
	if err := cacheops.CheckGuard(ctx); err != nil {
		for j := range errs {
			errs[j] = err
		}
		return errs
	}
	if c.meta == nil {
		for j := range n {
			_, it := mk(j)
			errs[j] = store(it)
		}
		return errs
	}
	cmds := make([]metaproto.Cmd, n)
	for j := range n {
		cmds[j], _ = mk(j)
	}
	done := c.roundTrip("ms", cmds[0].Key)
	replies, _ := c.meta.Do(ctx, cmds)
	done()
	for j := range replies {
		errs[j] = replyError(&replies[j])
	}
	return errs
}

// replyError turns the reply to an ms into gomemcache's error for the
// same outcome; nil for HD.
func replyError(rep *metaproto.Reply) error {
	switch rep.Status {
	case metaproto.HD:
		return nil
	case metaproto.EX:
		return memcache.ErrCASConflict
	case metaproto.NF:
		return memcache.ErrCacheMiss
	case metaproto.NS:
		return memcache.ErrNotStored
	case metaproto.Failed:
		if rep.Err != nil {
			return rep.Err
		}
	}
	return metaproto.ReplyError(rep)
}
