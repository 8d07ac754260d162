package counters

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// DefaultFenceTTL is Config.FenceTTL's default. A fence only matters while
// events from before it may still arrive, so it must outlive the longest
// consumer lag; after it expires the counter is treated as unfenced.
const DefaultFenceTTL = time.Hour

// maxExactAttempts bounds the tries of an exact recount (recountExact)
// whose compare-and-swap keeps losing to deltas; after them the counter is
// deleted.
const maxExactAttempts = 3

// SnapshotCount is a count taken inside a consistent snapshot.
type SnapshotCount struct {
	// N is the count.
	N int64
	// At is the binary log position the snapshot corresponds to: every
	// transaction the log holds up to At is in N, none after it. Zero when
	// the server cannot say.
	At BinlogPosition
	// NoPosition says why At is zero ("" when it is known).
	NoPosition string
}

// SnapshotCounter runs a recount query inside a consistent snapshot and
// reports the snapshot's binary log position. *MySQL satisfies it;
// Counters uses it, when its Recounter has it, to fence recounts.
// Implementations must be safe for concurrent use.
type SnapshotCounter interface {
	CountInSnapshot(ctx context.Context, query string, args []rules.Value) (SnapshotCount, error)
}

// fencing is the part of Counters that keeps counters exact under races
// between recounts and in-flight deltas.
type fencing struct {
	// snap is nil when fencing is off (Config.DisableFences, or a
	// Recounter without snapshots): then Counters behaves as without
	// fences.
	snap SnapshotCounter
	ttl  time.Duration

	fenced, unfenced, giveUps atomic.Uint64
	// state is what the last recount learned: 0 nothing yet, 1 fenced,
	// 2 unfenced; a change is logged once.
	state        atomic.Uint32
	logMu        sync.Mutex
	incomparable atomic.Bool
}

const (
	fencingUnknown uint32 = iota
	fencingOn
	fencingOff
)

func (c *Counters) initFencing() {
	c.fence.ttl = c.cfg.FenceTTL
	if c.fence.ttl <= 0 {
		c.fence.ttl = DefaultFenceTTL
	}
	if c.cfg.DisableFences {
		return
	}
	if s, ok := c.rc.(SnapshotCounter); ok {
		c.fence.snap = s
	}
}

// Fencing reports whether recounts are fenced when the database names
// their snapshot's position (see docs/exact-counters.md): fences are not
// disabled and the Recounter is a SnapshotCounter.
func (c *Counters) Fencing() bool { return c.fence.snap != nil }

// noteFencing records what a recount learned about fencing and logs it
// when it changed: once at the first recount, again only on a change
// (binary log turned on or off).
func (c *Counters) noteFencing(sc SnapshotCount) {
	state := fencingOn
	if !sc.At.Known() {
		state = fencingOff
		c.fence.unfenced.Add(1)
	} else {
		c.fence.fenced.Add(1)
	}
	if c.fence.state.Load() == state {
		return
	}
	c.fence.logMu.Lock()
	defer c.fence.logMu.Unlock()
	if c.fence.state.Swap(state) == state {
		return
	}
	if state == fencingOn {
		c.log.Info("counter recounts are fenced at their snapshot's binary log position; in-flight deltas are not counted twice",
			"position", sc.At.String())
		return
	}
	c.log.Warn("counter recounts cannot be fenced; deltas in flight during a recount may be counted twice or lost, as without fences (see docs/exact-counters.md)",
		"reason", sc.NoPosition)
}

// recountAt recounts op's counter. With fencing on it counts in a
// consistent snapshot and returns the fence to store with the result (a
// fresh random ID); the zero Fence when the database cannot name the
// snapshot's position, or fencing is off.
func (c *Counters) recountAt(ctx context.Context, query string, args []rules.Value) (int64, Fence, error) {
	c.recounts.Add(1)
	var (
		n     int64
		fence Fence
		err   error
	)
	if c.fence.snap == nil {
		n, err = c.rc.Count(ctx, query, args)
	} else {
		var sc SnapshotCount
		sc, err = c.fence.snap.CountInSnapshot(ctx, query, args)
		n = sc.N
		if err == nil {
			c.noteFencing(sc)
			if sc.At.Known() {
				fence = Fence{At: sc.At, ID: newFenceID()}
			}
		}
	}
	if err == nil && n < 0 {
		err = fmt.Errorf("counters: recount returned %d, a counter cannot be negative", n)
	}
	if err != nil {
		c.recountErrors.Add(1)
		return 0, Fence{}, err
	}
	return n, fence, nil
}

// newFenceID returns a random non-zero ID.
func newFenceID() uint32 {
	for {
		if id := rand.Uint32(); id != 0 {
			return id
		}
	}
}

// counterItem is the item holding n recounted at fence (Flags = fence.ID).
func (c *Counters) counterItem(key string, n int64, fence Fence, ttl time.Duration) *memcache.Item {
	return &memcache.Item{Key: key, Value: strconv.AppendInt(nil, n, 10), Flags: fence.ID, Expiration: c.expiration(ttl)}
}

// storeFence writes the fence of the counter at key. It always precedes
// the store of the value it describes, so that no daemon can see the value
// without the fence (which would make it apply deltas the value includes).
func (c *Counters) storeFence(key string, fence Fence) error {
	err := c.set(&memcache.Item{Key: FenceKey(key), Value: encodeFence(fence), Expiration: c.expiration(c.fence.ttl)})
	if err != nil {
		return fmt.Errorf("counters: set fence of %q: %w", key, err)
	}
	return nil
}

// addFenced stores n, recounted at fence for a delta that found the
// counter missing. The fence goes first, then the value with add. When
// add loses (the counter was created since the miss), the delta's change
// is already in the winner's value if that value is consistent with its
// fence and the delta's event is at or before it; otherwise the counter
// is recounted exactly (DESIGN's "apply the delta again" would count the
// change twice whenever the winner recounted after it was committed).
func (c *Counters) addFenced(ctx context.Context, op *rules.Op, n int64, fence Fence) cacheops.Result {
	if err := c.storeFence(op.Key, fence); err != nil {
		return failed(err)
	}
	err := c.add(c.counterItem(op.Key, n, fence, op.Rule.TTL))
	switch {
	case err == nil:
		return cacheops.Result{Outcome: cacheops.OutcomeLoaded}
	case !errors.Is(err, memcache.ErrNotStored):
		return failed(fmt.Errorf("counters: add %q: %w", op.Key, err))
	}
	views := make(map[string]FenceView, 1)
	if err := c.viewFences([]string{op.Key}, views); err != nil {
		return failed(err)
	}
	v := views[op.Key]
	if v.Consistent() {
		if order, ok := ComparePositions(PositionOf(op.Source), v.Fence.At); ok && order <= 0 {
			c.log.Debug("counter add lost a race to a recount that includes the change", "key", op.Key, "rule", op.Rule.Name)
			return cacheops.Result{Outcome: cacheops.OutcomeLoaded}
		}
	}
	c.log.Debug("counter add lost a race; recounting exactly", "key", op.Key, "rule", op.Rule.Name)
	return c.recountExact(ctx, op)
}

// recountExact recounts the counter and stores the result so that no
// delta is lost or counted twice: it reads the counter (with its cas
// token) before the snapshot, writes the fence, then stores the value with
// cas (or add when it was missing). A delta that lands in between changes
// the cas token, so the store fails and the whole recount starts over:
// the next snapshot includes that delta's change. A store that fails
// because another recount at a snapshot no older than ours stored first is
// done: that value holds everything ours would. After maxExactAttempts
// the counter is deleted (missing is correct). When the database cannot
// name the snapshot's position the result is stored with set and no
// fence, as without fences.
func (c *Counters) recountExact(ctx context.Context, op *rules.Op) cacheops.Result {
	if op.Rule.Query == "" || c.rc == nil {
		return c.deleteItem(op.Key, "recount: no recount query")
	}
	for range maxExactAttempts {
		var (
			cur *memcache.Item
			err error
		)
		if c.fence.state.Load() != fencingOff {
			// The cas token, for a store that fails if a delta lands
			// during the recount. Not needed while the database cannot
			// fence: the result is then stored with set (and when it
			// can again, a present counter fails the add: count again).
			cur, err = c.get(op.Key)
			if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
				return failed(fmt.Errorf("counters: gets %q: %w", op.Key, err))
			}
		}
		n, fence, rerr := c.recountAt(ctx, op.Rule.Query, op.Args)
		if rerr != nil {
			return c.deleteAfterRecountError(ctx, op, rerr)
		}
		it := c.counterItem(op.Key, n, fence, op.Rule.TTL)
		if fence.ID == 0 {
			if err := c.set(it); err != nil {
				return failed(fmt.Errorf("counters: set %q: %w", op.Key, err))
			}
			return cacheops.Result{Outcome: cacheops.OutcomeRecounted}
		}
		if err := c.storeFence(op.Key, fence); err != nil {
			return failed(err)
		}
		if cur != nil {
			it.CasID = cur.CasID
			err = c.cas(it)
		} else {
			err = c.add(it)
		}
		switch {
		case err == nil:
			return cacheops.Result{Outcome: cacheops.OutcomeRecounted}
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
			// Changed, created or deleted since our read. When another
			// recount stored a value at a snapshot no older than ours,
			// that value holds everything ours would: done. Else (a
			// delta landed) count again.
			views := make(map[string]FenceView, 1)
			if err := c.viewFences([]string{op.Key}, views); err != nil {
				return failed(err)
			}
			if v := views[op.Key]; v.Consistent() {
				if order, ok := ComparePositions(v.Fence.At, fence.At); ok && order >= 0 {
					return cacheops.Result{Outcome: cacheops.OutcomeRecounted}
				}
			}
			c.log.Debug("counter changed during its recount; counting again", "key", op.Key, "rule", op.Rule.Name)
			continue
		default:
			return failed(fmt.Errorf("counters: store %q: %w", op.Key, err))
		}
	}
	c.fence.giveUps.Add(1)
	c.log.Debug("counter kept changing during its recounts; deleting it", "key", op.Key, "rule", op.Rule.Name, "attempts", maxExactAttempts)
	return c.deleteItem(op.Key, "recount: the counter kept changing")
}

// viewFences reads the counters at keys and their fences in one GetMulti
// and records what it saw in into (every key gets an entry).
func (c *Counters) viewFences(keys []string, into map[string]FenceView) error {
	if len(keys) == 0 {
		return nil
	}
	all := make([]string, 0, 2*len(keys))
	fenceOf := make(map[string]string, len(keys))
	for _, k := range keys {
		fk := FenceKey(k)
		fenceOf[fk] = k
		all = append(all, k, fk)
	}
	items, err := c.getMulti(all)
	if err != nil {
		return fmt.Errorf("counters: get %d counters and fences: %w", len(keys), err)
	}
	for _, k := range keys {
		into[k] = FenceView{}
	}
	for key, it := range items {
		if k, ok := fenceOf[key]; ok {
			v := into[k]
			v.HasFence = true
			f, err := parseFence(it.Value)
			v.Fence, v.BadFence = f, err != nil
			into[k] = v
			continue
		}
		if v, ok := into[key]; ok {
			v.Counter, v.Flags = true, it.Flags
			into[key] = v
		}
	}
	return nil
}

// FenceStats counts what fence checks did to one batch's counter deltas.
type FenceStats struct {
	// Checked counts deltas with a binary log position whose fence was
	// looked up.
	Checked int
	// Skipped counts deltas dropped because the fence's recount includes
	// them.
	Skipped int
	// Recounts counts counters whose deltas became a recount because the
	// counter and its fence disagreed.
	Recounts int
	// Incomparable counts deltas applied because their position and the
	// fence's could not be compared.
	Incomparable int
	// Rechecked counts counters looked at again after their deltas were
	// applied; RecheckRecounts those recounted because a recount may have
	// counted their deltas already.
	Rechecked, RecheckRecounts int
}

// DeltaFence carries one batch's fence checks from before its counter
// deltas are coalesced (coalescing sums them per key and loses their
// positions) to after they are applied. The zero value is ready; reuse it
// batch after batch, from one goroutine at a time.
type DeltaFence struct {
	// Stats are the current batch's counts.
	Stats FenceStats

	keys    []string
	before  map[string]FenceView
	after   map[string]FenceView
	first   map[string]BinlogPosition
	recount map[string]bool
}

// reset forgets the previous batch.
func (d *DeltaFence) reset() {
	d.Stats = FenceStats{}
	d.keys = d.keys[:0]
	if d.before == nil {
		d.before = make(map[string]FenceView)
		d.after = make(map[string]FenceView)
		d.first = make(map[string]BinlogPosition)
		d.recount = make(map[string]bool)
	}
	clear(d.before)
	clear(d.after)
	clear(d.first)
	clear(d.recount)
}

// CheckDeltas filters a batch's planned (not yet coalesced) ops against the
// fences of their counters, read in one GetMulti round trip: a count op
// whose event is at or before its counter's fence is dropped, one whose
// counter and fence disagree becomes a recount (Verdict), the others stay.
// Ops of other kinds and count ops without a binary log position are kept
// as they are. ops is filtered in place and returned; d remembers what was
// seen for RecheckDeltas.
//
// With fencing off (Fencing) ops are returned unchanged and nothing is
// read. On error ops are unchanged (the caller retries or gives up on the
// batch). Safe for concurrent use with distinct DeltaFences.
func (c *Counters) CheckDeltas(ctx context.Context, d *DeltaFence, ops []rules.Op) ([]rules.Op, error) {
	d.reset()
	if c.fence.snap == nil {
		return ops, nil
	}
	for i := range ops {
		op := &ops[i]
		if op.Kind != rules.OpCount || !PositionOf(op.Source).Known() {
			continue
		}
		d.Stats.Checked++
		if _, ok := d.before[op.Key]; !ok {
			d.before[op.Key] = FenceView{}
			d.keys = append(d.keys, op.Key)
		}
	}
	if len(d.keys) == 0 {
		return ops, nil
	}
	if err := ctx.Err(); err != nil {
		return ops, fmt.Errorf("counters: check fences: %w", err)
	}
	if err := c.viewFences(d.keys, d.before); err != nil {
		clear(d.before)
		d.keys = d.keys[:0]
		return ops, err
	}
	out := ops[:0]
	for i := range ops {
		op := ops[i]
		at := PositionOf(op.Source)
		if op.Kind != rules.OpCount || !at.Known() {
			out = append(out, op)
			continue
		}
		verdict, incomparable := d.before[op.Key].Verdict(op.Source)
		switch verdict {
		case Skip:
			d.Stats.Skipped++
			continue
		case Recount:
			if !d.recount[op.Key] {
				d.recount[op.Key] = true
				d.Stats.Recounts++
			}
			op.Kind, op.Delta = rules.OpRecount, 0
		case Apply:
			if incomparable {
				d.Stats.Incomparable++
				if !c.fence.incomparable.Swap(true) {
					c.log.Warn("a delta's binary log position cannot be compared with its counter's fence (different log file names: a failover, or recounts on another server than the one the change events come from); applying it unfenced",
						"key", op.Key, "event_position", at.String(), "fence", d.before[op.Key].Fence.At.String())
				}
			}
			if prev, ok := d.first[op.Key]; !ok {
				d.first[op.Key] = at
			} else if order, ok := ComparePositions(at, prev); ok && order < 0 {
				d.first[op.Key] = at
			}
		}
		out = append(out, op)
	}
	clear(ops[len(out):]) // drop references held by the dropped tail
	return out, nil
}

// RecheckDeltas looks again, in one GetMulti round trip, at the counters
// to which the batch's checked deltas were applied with incr or decr (ops
// and results are the applied, coalesced ops and their results), and
// appends to dst a recount op for every counter that a recount stored in
// the meantime may already have counted them on (RecheckVerdict): the
// fence read by CheckDeltas could be outdated by the time the incr landed.
// With nothing to recheck it reads nothing.
func (c *Counters) RecheckDeltas(ctx context.Context, d *DeltaFence, dst, ops []rules.Op, results []cacheops.Result) ([]rules.Op, error) {
	d.keys = d.keys[:0]
	clear(d.after)
	for i := range ops {
		op := &ops[i]
		if op.Kind != rules.OpCount || i >= len(results) || results[i].Err != nil {
			continue
		}
		if o := results[i].Outcome; o != cacheops.OutcomeIncr && o != cacheops.OutcomeDecr {
			continue // loaded or recounted: the recount saw the change
		}
		if _, ok := d.first[op.Key]; !ok {
			continue
		}
		if _, ok := d.after[op.Key]; !ok {
			d.after[op.Key] = FenceView{}
			d.keys = append(d.keys, op.Key)
		}
	}
	if len(d.keys) == 0 {
		return dst, nil
	}
	if err := ctx.Err(); err != nil {
		return dst, fmt.Errorf("counters: recheck fences: %w", err)
	}
	if err := c.viewFences(d.keys, d.after); err != nil {
		return dst, err
	}
	d.Stats.Rechecked = len(d.keys)
	for i := range ops {
		op := &ops[i]
		after, ok := d.after[op.Key]
		if !ok {
			continue
		}
		delete(d.after, op.Key) // one recount per key
		if RecheckVerdict(d.before[op.Key], after, d.first[op.Key]) != Recount {
			continue
		}
		d.Stats.RecheckRecounts++
		c.log.Debug("a recount raced with the counter's deltas; recounting", "key", op.Key, "rule", ruleName(op.Rule))
		dst = append(dst, rules.Op{Kind: rules.OpRecount, Rule: op.Rule, Key: op.Key, Args: op.Args, Source: op.Source})
	}
	return dst, nil
}

func ruleName(r *rules.Rule) string {
	if r == nil {
		return ""
	}
	return r.Name
}
