package counters

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
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
	// ServerID is the @@server_id of the server that counted (0 when At
	// is zero).
	ServerID uint32
	// GTID is the snapshot's GTID position or set when the server named
	// it (see SnapshotOptions), "" otherwise.
	GTID string
	// NoPosition says why At is zero ("" when it is known), and Unfenced
	// the same as a metric label.
	NoPosition string
	Unfenced   UnfencedReason
}

// SnapshotCounter runs a recount query inside a consistent snapshot and
// reports the snapshot's binary log position. *MySQL satisfies it;
// Counters uses it, when its Recounter has it, to fence recounts.
// Implementations must be safe for concurrent use.
type SnapshotCounter interface {
	CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts SnapshotOptions) (SnapshotCount, error)
}

// fencing is the part of Counters that keeps counters exact under races
// between recounts and in-flight deltas.
type fencing struct {
	// snap is nil when fencing is off (Config.DisableFences, or a
	// Recounter without snapshots): then Counters behaves as without
	// fences.
	snap SnapshotCounter
	ttl  time.Duration

	fenced, giveUps atomic.Uint64
	// unfenced counts recounts stored without a fence, by reason.
	unfenced [nUnfencedReasons]atomic.Uint64
	// state is what the last recount learned: 0 nothing yet, 1 fenced,
	// 2 unfenced; a change is logged once.
	state        atomic.Uint32
	logMu        sync.Mutex
	incomparable atomic.Bool
	// wantGTID is set once a delta carried a GTID but no binary log
	// position: recounts then ask for their snapshot's GTID position.
	wantGTID atomic.Bool
	// required refuses unfenced recounts at start (Config.Fencing).
	required bool
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
	c.fence.required = c.cfg.Fencing == FencingRequired
	if c.cfg.DisableFences || c.cfg.Fencing == FencingOff {
		return
	}
	if s, ok := c.rc.(SnapshotCounter); ok {
		c.fence.snap = s
	}
}

// FencingMode is Config.Fencing: whether recounts are fenced.
type FencingMode string

const (
	// FencingAuto (the default, also ""): fence whenever the database can
	// name a snapshot's position, fall back to unfenced recounts (with a
	// warning and cachewarden_recount_unfenced_total) when it cannot.
	FencingAuto FencingMode = "auto"
	// FencingOff: never fence (as DisableFences).
	FencingOff FencingMode = "off"
	// FencingRequired: as auto, but CheckFencing fails when the database
	// cannot fence, so that the daemon refuses to start.
	FencingRequired FencingMode = "required"
)

// ErrCannotFence is returned by CheckFencing when Config.Fencing is
// FencingRequired and recounts cannot be fenced.
var ErrCannotFence = errors.New("counters: fencing is required but recounts cannot be fenced")

// CheckFencing asks the database, with one snapshot recount of "SELECT 0",
// whether recounts can be fenced. It returns nil when they can, or when
// Config.Fencing is not FencingRequired (the answer is then only logged as
// the first recount's would be); otherwise an error wrapping
// ErrCannotFence that says why. Safe for concurrent use.
func (c *Counters) CheckFencing(ctx context.Context) error {
	if !c.fence.required {
		return nil
	}
	if c.fence.snap == nil {
		return fmt.Errorf("%w: the recounter cannot count in a consistent snapshot (no mysql.dsn?)", ErrCannotFence)
	}
	sc, err := c.fence.snap.CountInSnapshot(ctx, "SELECT 0", nil, SnapshotOptions{})
	if err != nil {
		return fmt.Errorf("%w: probing the database: %w", ErrCannotFence, err)
	}
	if !sc.At.Known() {
		return fmt.Errorf("%w: %s (see docs/exact-counters.md)", ErrCannotFence, sc.NoPosition)
	}
	return nil
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
		reason := sc.Unfenced
		if reason == 0 || reason >= nUnfencedReasons {
			reason = UnfencedNoSnapshotPosition
		}
		c.fence.unfenced[reason].Add(1)
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
// fresh random ID, none of avoid); the zero Fence when the database cannot
// name the snapshot's position, or fencing is off.
func (c *Counters) recountAt(ctx context.Context, query string, args []rules.Value, avoid ...uint32) (int64, Fence, error) {
	c.recounts.Add(1)
	if c.fence.snap != nil {
		sc, err := c.fence.snap.CountInSnapshot(ctx, query, args, SnapshotOptions{GTID: c.fence.wantGTID.Load()})
		return c.snapshotRecount(ctx, sc, err, avoid...)
	}
	n, err := c.rc.Count(ctx, query, args)
	if err == nil {
		c.notePlainRecount()
	}
	return c.checkRecount(ctx, n, Fence{}, err)
}

// snapshotRecount is recountAt's result for a count in a snapshot (sc, or
// err): the fence to store with it (a fresh random ID, none of avoid)
// when the snapshot's position is known.
func (c *Counters) snapshotRecount(ctx context.Context, sc SnapshotCount, err error, avoid ...uint32) (int64, Fence, error) {
	var fence Fence
	if err == nil {
		c.noteFencing(sc)
		if sc.At.Known() {
			fence = Fence{At: sc.At, ServerID: sc.ServerID, GTID: sc.GTID, ID: newFenceID(avoid...)}
		}
	}
	return c.checkRecount(ctx, sc.N, fence, err)
}

// checkRecount ends a recount: a failed or negative count is an error
// (counted), and so is a guard that no longer allows writing.
func (c *Counters) checkRecount(ctx context.Context, n int64, fence Fence, err error) (int64, Fence, error) {
	if err == nil && n < 0 {
		err = fmt.Errorf("counters: recount returned %d, a counter cannot be negative", n)
	}
	if err != nil {
		c.recountErrors.Add(1)
		return 0, Fence{}, err
	}
	// The query may have been long: look again before writing.
	if err := cacheops.CheckGuard(ctx); err != nil {
		return 0, Fence{}, err
	}
	return n, fence, nil
}

// notePlainRecount counts a recount that ran without a snapshot because
// fencing is off or the Recounter cannot count in one.
func (c *Counters) notePlainRecount() {
	reason := UnfencedNoSnapshots
	if c.cfg.DisableFences || c.cfg.Fencing == FencingOff {
		reason = UnfencedDisabled
	}
	c.fence.unfenced[reason].Add(1)
}

// newFenceID returns a random fence ID: counter flags that use only the
// bits itemformat.CounterFlagsMask allows (so that other languages' clients
// read the counter as a plain number), never 0 (no fence),
// itemformat.ReaderCountFlags or any of avoid (the flags of the counter the
// recount will replace, so that the old value never matches the new
// fence).
func newFenceID(avoid ...uint32) uint32 {
	shift := bits.TrailingZeros32(itemformat.CounterFlagsMask)
	ids := itemformat.CounterFlagsMask >> shift // the ids the mask leaves
	for {
		id := uint32(1+rand.Uint32N(ids)) << shift // never 0
		if id != itemformat.ReaderCountFlags && !slices.Contains(avoid, id) {
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
// add loses (the counter was created since the miss), the counter is
// recounted exactly (recountExact), whatever the winner's fence says.
//
// Why not decide from the winner's fence, as for a single delta? op may
// be coalesced: it sums a batch's deltas for the key and carries only its
// first delta's source. A winner fenced after that first delta but before
// a later one holds the first change and lacks the later: "the winner
// includes op.Source" does not mean "the winner includes op". Carrying the
// latest position instead would need a "latest" among deltas of several
// servers or GTID domains, which does not always exist. A recount needs
// none of that: recountExact's store succeeds only if no delta touched
// the counter between its read and its store, so its value is exact
// whatever deltas op stood for, and it costs one more query on a race
// that is rare (two writers missing the same counter at once).
//
// err is a failed recount (the caller deletes the counter); memcached
// failures fail res.
func (c *Counters) addFenced(ctx context.Context, op *rules.Op, n int64, fence Fence) (res cacheops.Result, err error) {
	if err := c.storeFence(op.Key, fence); err != nil {
		return failed(err), nil
	}
	err = c.add(c.counterItem(op.Key, n, fence, op.Rule.TTL))
	switch {
	case err == nil:
		return cacheops.Result{Outcome: cacheops.OutcomeLoaded}, nil
	case !errors.Is(err, memcache.ErrNotStored):
		return failed(fmt.Errorf("counters: add %q: %w", op.Key, err)), nil
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
// fence, as without fences. err is a recount that failed (the caller
// deletes the counter); memcached failures fail res.
func (c *Counters) recountExact(ctx context.Context, op *rules.Op) (res cacheops.Result, err error) {
	return c.recountExactN(ctx, op, maxExactAttempts)
}

// recountExactN is recountExact with at most attempts tries (at least
// one).
func (c *Counters) recountExactN(ctx context.Context, op *rules.Op, attempts int) (res cacheops.Result, err error) {
	for range max(attempts, 1) {
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
				return failed(fmt.Errorf("counters: gets %q: %w", op.Key, err)), nil
			}
		}
		var avoid []uint32
		if cur != nil {
			avoid = append(avoid, cur.Flags)
		}
		n, fence, rerr := c.recountAt(ctx, op.Rule.Query, op.Args, avoid...)
		if rerr != nil {
			return cacheops.Result{}, rerr
		}
		it := c.counterItem(op.Key, n, fence, op.Rule.TTL)
		if fence.ID == 0 {
			if err := c.set(it); err != nil {
				return failed(fmt.Errorf("counters: set %q: %w", op.Key, err)), nil
			}
			return cacheops.Result{Outcome: cacheops.OutcomeRecounted}, nil
		}
		if err := c.storeFence(op.Key, fence); err != nil {
			return failed(err), nil
		}
		if cur != nil {
			it.CasID = cur.CasID
			err = c.cas(it)
		} else {
			err = c.add(it)
		}
		switch {
		case err == nil:
			return cacheops.Result{Outcome: cacheops.OutcomeRecounted}, nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
			// Changed, created or deleted since our read. When another
			// recount stored a value at a snapshot no older than ours,
			// that value holds everything ours would: done. Else (a
			// delta landed) count again.
			views := make(map[string]FenceView, 1)
			if err := c.viewFences([]string{op.Key}, views, nil); err != nil {
				return failed(err), nil
			}
			// Our own fence over a counter we did not store: whatever
			// stored it drew the same id (fence ids have 16 bits), so
			// the pair only looks consistent. Count again.
			if v := views[op.Key]; v.Consistent() && v.Fence != fence {
				if order, ok := ComparePositions(v.Fence.At, fence.At); ok && order >= 0 {
					return cacheops.Result{Outcome: cacheops.OutcomeRecounted}, nil
				}
			}
			c.log.Debug("counter changed during its recount; counting again", "key", op.Key, "rule", op.Rule.Name)
			continue
		default:
			return failed(fmt.Errorf("counters: store %q: %w", op.Key, err)), nil
		}
	}
	c.fence.giveUps.Add(1)
	c.log.Debug("counter kept changing during its recounts; deleting it", "key", op.Key, "rule", op.Rule.Name, "attempts", max(attempts, 1))
	return c.deleteItem(op.Key, "recount: the counter kept changing"), nil
}

// viewScratch is what viewFences reuses from call to call: the keys it
// asks for, and the fence keys of the counters seen (kept until reset, so
// that a batch's recheck finds those of its check).
type viewScratch struct {
	all []string
	// fenceKey maps counter keys to their fence keys, counterOf the
	// other way.
	fenceKey, counterOf map[string]string
}

func (sc *viewScratch) reset() {
	clear(sc.all[:cap(sc.all)]) // drop the references to keys
	sc.all = sc.all[:0]
	clear(sc.fenceKey)
	clear(sc.counterOf)
}

// viewFences reads the counters at keys and their fences in one GetMulti
// and records what it saw in into (every key gets an entry). sc may be
// nil (nothing reused).
func (c *Counters) viewFences(keys []string, into map[string]FenceView, sc *viewScratch) error {
	if len(keys) == 0 {
		return nil
	}
	if sc == nil {
		sc = &viewScratch{}
	}
	if sc.fenceKey == nil {
		sc.fenceKey = make(map[string]string, len(keys))
		sc.counterOf = make(map[string]string, len(keys))
	}
	all := sc.all[:0]
	for _, k := range keys {
		fk, ok := sc.fenceKey[k]
		if !ok {
			fk = FenceKey(k)
			sc.fenceKey[k], sc.counterOf[fk] = fk, k
		}
		all = append(all, k, fk)
	}
	sc.all = all
	fenceOf := sc.counterOf
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
			f, err := ParseFence(it.Value)
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
	// Checked counts deltas with a binary log position or a GTID whose
	// fence was looked up.
	Checked int
	// Skipped counts deltas dropped because the fence's recount includes
	// them.
	Skipped int
	// Recounts counts counters whose deltas became a recount (all
	// reasons); FenceMissing and OtherServer count those of them whose
	// fence was gone while the counter's flags named one, or whose deltas
	// came from another server's log than the fence.
	Recounts, FenceMissing, OtherServer int
	// Unfenced counts deltas applied without a fence decision because
	// their event has no position the fence can be compared with (a GTID
	// only, with a fence without GTID set).
	Unfenced int
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

	keys   []string
	before map[string]FenceView
	after  map[string]FenceView
	// applied holds the keys of the deltas CheckDeltas kept to apply,
	// and sources those deltas' keys and event positions, in op order
	// (RecheckVerdict needs them only for a counter that changed).
	applied map[string]struct{}
	sources []keyedPosition
	recount map[string]bool
	scratch viewScratch
}

// keyedPosition is the event position of a delta to the counter at key.
type keyedPosition struct {
	key string
	pos rules.Position
}

// reset forgets the previous batch.
func (d *DeltaFence) reset() {
	d.Stats = FenceStats{}
	clear(d.keys[:cap(d.keys)])
	d.keys = d.keys[:0]
	if d.before == nil {
		d.before = make(map[string]FenceView)
		d.after = make(map[string]FenceView)
		d.applied = make(map[string]struct{})
		d.recount = make(map[string]bool)
	}
	clear(d.before)
	clear(d.after)
	clear(d.applied)
	clear(d.sources)
	d.sources = d.sources[:0]
	clear(d.recount)
	d.scratch.reset()
}

// sourcesOf returns the event positions of the applied deltas to key.
func (d *DeltaFence) sourcesOf(key string) []rules.Position {
	var out []rules.Position
	for i := range d.sources {
		if d.sources[i].key == key {
			out = append(out, d.sources[i].pos)
		}
	}
	return out
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
		if op.Kind != rules.OpCount || !fenceable(op.Source) {
			continue
		}
		d.Stats.Checked++
		if !PositionOf(op.Source).Known() {
			c.noteGTIDOnly(*op)
		}
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
	if err := c.viewFences(d.keys, d.before, &d.scratch); err != nil {
		clear(d.before)
		d.keys = d.keys[:0]
		return ops, err
	}
	out := ops[:0]
	for i := range ops {
		op := ops[i]
		if op.Kind != rules.OpCount || !fenceable(op.Source) {
			out = append(out, op)
			continue
		}
		view := d.before[op.Key]
		verdict, why := view.Verdict(op.Source)
		switch verdict {
		case Skip:
			d.Stats.Skipped++
			continue
		case Recount:
			if !d.recount[op.Key] {
				d.recount[op.Key] = true
				d.Stats.Recounts++
				switch why {
				case FenceMissing:
					d.Stats.FenceMissing++
				case OtherServer:
					d.Stats.OtherServer++
					c.warnOtherServer(op, view)
				}
			}
			op.Kind, op.Delta = rules.OpRecount, 0
		case Apply:
			if why == NoPosition {
				d.Stats.Unfenced++
			}
			d.applied[op.Key] = struct{}{}
			d.sources = append(d.sources, keyedPosition{op.Key, op.Source})
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
		if _, ok := d.applied[op.Key]; !ok {
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
	if err := c.viewFences(d.keys, d.after, &d.scratch); err != nil {
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
		before := d.before[op.Key]
		if before.same(after) || !after.Counter {
			continue // RecheckVerdict's Apply, without collecting the sources
		}
		if RecheckVerdict(before, after, d.sourcesOf(op.Key)) != Recount {
			continue
		}
		d.Stats.RecheckRecounts++
		c.log.Debug("a recount raced with the counter's deltas; recounting", "key", op.Key, "rule", ruleName(op.Rule))
		dst = append(dst, rules.Op{Kind: rules.OpRecount, Rule: op.Rule, Key: op.Key, Args: op.Args, Source: op.Source})
	}
	return dst, nil
}

// warnOtherServer logs, once per Counters, a delta whose position belongs
// to another server's log than its counter's fence.
func (c *Counters) warnOtherServer(op rules.Op, v FenceView) {
	if c.fence.incomparable.Swap(true) {
		return
	}
	c.log.Warn("a delta's position belongs to another server's binary log than its counter's fence (different server_id or log base name: a failover, or mysql.dsn not pointing at the server the change stream reads); recounting instead (see docs/exact-counters.md)",
		"key", op.Key, "event_position", PositionOf(op.Source).String(), "event_server_id", op.Source.ServerID,
		"fence", v.Fence.At.String(), "fence_server_id", v.Fence.ServerID)
}

// noteGTIDOnly records that a delta carried a GTID its counter's fence
// could not be compared with: from now on recounts ask the server for
// their snapshot's GTID position (SnapshotOptions.GTID).
func (c *Counters) noteGTIDOnly(op rules.Op) {
	if op.Source.GTID == "" || c.fence.wantGTID.Swap(true) {
		return
	}
	c.log.Info("change events carry GTIDs without binary log positions; recounts now also record their snapshot's GTID position where the server can name it (see docs/exact-counters.md)",
		"key", op.Key, "gtid", op.Source.GTID)
}

func ruleName(r *rules.Rule) string {
	if r == nil {
		return ""
	}
	return r.Name
}
