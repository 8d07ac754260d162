// Package counters keeps cached row counts in memcached exact: it applies
// counter ops (OpCount deltas, OpRecount) with the one cache applier of
// package cacheops over the text protocol, and does the recounts that
// need more than a query and a store itself: with fencing
// (docs/exact-counters.md) every recount runs in a consistent snapshot,
// stores its binary log position as the counter's fence, and is stored
// so that no delta in flight is lost or counted twice; CheckDeltas and
// RecheckDeltas filter deltas against the fences. It also runs the load
// and recount queries against MySQL (MySQL) for the daemon.
//
// A counter item holds the count as ASCII decimal digits, so memcached's own
// incr and decr change it atomically and no value is ever read, changed and
// written back, except when it is recomputed from MySQL. A missing counter is
// always a correct state; a counter that may be wrong is recounted or
// deleted, never guessed.
//
// It is not the read side: applications read counters with package client
// (client.Count); Counters.Get serves this package's tests and tools.
package counters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Recounter runs a count rule's recount query with args bound to its '?'
// placeholders and returns the single integer it yields. *MySQL satisfies
// it. Implementations must be safe for concurrent use.
type Recounter interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
}

// Config tunes Counters. The zero value gives the documented defaults.
type Config struct {
	// MaxConcurrency bounds the keys one Apply works on at a time. Default
	// cacheops.DefaultMaxConcurrency (32). The memcache.Client's MaxIdleConns should be at least this, or
	// connections are opened and closed all the time.
	MaxConcurrency int
	// ReadTTL is the item TTL of the counters Get stores after a miss; 0
	// means no expiry. Writers use their rule's TTL instead.
	ReadTTL time.Duration
	// Now turns TTLs longer than 30 days into memcached's absolute expiry
	// times. Default time.Now.
	Now func() time.Time
	// FenceTTL is the item TTL of the fences stored with recounts
	// (docs/exact-counters.md); it must exceed the longest consumer lag.
	// Default DefaultFenceTTL (1h).
	FenceTTL time.Duration
	// DisableFences turns fencing off: recounts are plain queries and
	// deltas are applied whatever their position, as before fences
	// existed. Fencing is also off when the Recounter is not a
	// SnapshotCounter.
	DisableFences bool
	// Fencing is FencingAuto (default, also ""), FencingOff (as
	// DisableFences) or FencingRequired (CheckFencing fails when the
	// database cannot fence).
	Fencing FencingMode
	// ObserveRoundTrip, when set, receives the duration of every
	// memcached round trip; it must be safe for concurrent use.
	ObserveRoundTrip cacheops.RoundTripObserver
	// Servers, when set, must pick the same server for every key as the
	// memcache.Client given to New (the daemon passes the selector it
	// builds that client from): the recounts of one Apply then store
	// their fences and their values in one pipelined exchange per server
	// each (meta protocol), instead of one text request per item. Nil:
	// text requests only.
	Servers memcache.ServerSelector
	// Meta sets the pipelined connections to Servers (their number, the
	// bound on dialing and on each exchange, the dialer); the zero value
	// gives metaproto's defaults (metaproto.DefaultTimeout,
	// metaproto.DefaultConnsPerServer).
	Meta metaproto.PoolConfig
}

// Counters applies counter ops to memcached and reads counters. It is safe
// for concurrent use.
type Counters struct {
	mc  *memcache.Client
	rc  Recounter
	cfg Config
	log *slog.Logger

	// applier applies the ops: the deltas and their plain stores, with
	// the recounts done here (applierRecounter).
	applier *cacheops.Applier

	calls, recounts, recountErrors, drifts, deletes atomic.Uint64

	fence fencing

	// meta sends the pipelined stores of applyRecounts (Config.Servers);
	// nil without Servers.
	meta *metaproto.Pool

	// faultPoint, when set (by tests only), runs before every memcached
	// round trip with the request's verb and first key: the place where a
	// test lets another writer act between two of this one's steps.
	faultPoint func(verb, key string)
}

// Stats are cumulative counts since the Counters was created.
type Stats struct {
	// Calls is the number of memcached requests made.
	Calls uint64
	// Recounts counts recount queries run, RecountErrors those that failed.
	Recounts, RecountErrors uint64
	// Drifts counts counters found possibly wrong: a decr that reached
	// zero (memcached clamps at zero) or a non-numeric item.
	Drifts uint64
	// Deletes counts counters deleted because they could not be recounted.
	Deletes uint64
	// FencedRecounts counts recounts stored with a fence (the database
	// named their snapshot's binary log position); UnfencedRecounts those
	// stored without one, for every reason; UnfencedBy splits them by
	// reason (UnfencedReason.String is the key).
	FencedRecounts, UnfencedRecounts uint64
	UnfencedBy                       map[string]uint64
	// ExactRecountGiveUps counts counters deleted because they changed
	// during every attempt of an exact recount.
	ExactRecountGiveUps uint64
}

// New returns Counters over mc. rc may be nil: then missing counters stay
// missing and counters that need a recount are deleted. A nil logger
// discards logs.
func New(mc *memcache.Client, rc Recounter, cfg Config, logger *slog.Logger) *Counters {
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = cacheops.DefaultMaxConcurrency
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Counters{mc: mc, rc: rc, cfg: cfg, log: logger}
	c.initFencing()
	if cfg.Servers != nil {
		c.meta = metaproto.NewPool(cfg.Servers, cfg.Meta)
	}
	var recounter cacheops.Recounter
	if rc != nil {
		recounter = applierRecounter{c}
	}
	c.applier = cacheops.NewTextApplier(mc, nil, recounter, cacheops.Config{
		MaxConcurrency:   cfg.MaxConcurrency,
		Now:              cfg.Now,
		ObserveRoundTrip: cfg.ObserveRoundTrip,
		CountersOnly:     true,
	}, logger)
	return c
}

// Close closes the pipelined connections to Config.Servers (those in use
// when their exchanges end); the memcache.Client given to New is the
// caller's to close. Apply must not be called after it.
func (c *Counters) Close() {
	if c.meta != nil {
		c.meta.Close()
	}
}

// Stats returns the counts so far.
func (c *Counters) Stats() Stats {
	var unfenced uint64
	by := make(map[string]uint64, nUnfencedReasons)
	for _, r := range UnfencedReasons() {
		n := c.fence.unfenced[r].Load()
		unfenced += n
		by[r.String()] = n
	}
	a := c.applier.Stats()
	return Stats{
		Calls:         c.calls.Load() + a.Commands,
		Recounts:      c.recounts.Load(),
		RecountErrors: c.recountErrors.Load(),
		Drifts:        c.drifts.Load() + a.Drifts,
		Deletes:       c.deletes.Load() + a.Deletes,

		FencedRecounts:      c.fence.fenced.Load(),
		UnfencedRecounts:    unfenced,
		UnfencedBy:          by,
		ExactRecountGiveUps: c.fence.giveUps.Load(),
	}
}

// Apply applies coalesced counter ops: OpCount (Delta summed per key) and
// OpRecount. Ops of different keys run concurrently, at most
// MaxConcurrency keys at a time; ops that share a key run one after the
// other in slice order. results[i] receives the outcome of ops[i];
// len(results) must be at least len(ops). An op of any other kind fails
// (cacheops.ErrInvalidOp) without a request.
//
// OpCount adds Delta with incr (Delta > 0) or decr (Delta < 0); a zero
// Delta sends nothing and reports cacheops.OutcomeIncr. On a miss, when
// the rule has a recount query and a Recounter was given, the count is
// recomputed (MySQL committed the change before it was published, so the
// result includes it) and stored with add (cacheops.OutcomeLoaded); when
// add finds the counter created meanwhile, the delta is applied to it
// again. Without a recount query the counter stays missing
// (cacheops.OutcomeMissing).
//
// memcached clamps a decr at zero, so a decr that returns 0 cannot tell a
// counter that reached exactly zero from one that would have gone below
// (drift). Both are recounted and stored with set
// (cacheops.OutcomeRecounted): an extra query for counters that reach zero,
// in exchange for never keeping a clamped value. A counter holding a value
// that is not a number is recounted the same way.
//
// OpRecount recounts and stores the result with set.
//
// With fencing on (Fencing, docs/exact-counters.md) every recount runs in
// a consistent snapshot and stores its binary log position as the
// counter's fence before the value; the value is then stored with cas (add
// when missing) and counted again if a delta changed the counter in the
// meantime, so that no delta is lost or counted twice. A lost add on a
// miss no longer re-applies the delta blindly: when the winner's fence
// shows its recount includes the change the op is done, else the counter
// is recounted exactly. Callers filter deltas against the fences with
// CheckDeltas and RecheckDeltas.
//
// The OpRecount ops of one Apply (two or more, each the only op of its
// key) are recounted together, step by step: one gets of them all, their
// counts in one snapshot (SnapshotBatchCounter), their fences, then their
// values (pipelined with Config.Servers). Per counter the steps and their
// order are those of a recount alone (recount_batch.go).
//
// Whenever a recount is needed and cannot be done (no query, no
// Recounter, MySQL down or failing, a negative result) the counter is
// deleted (cacheops.OutcomeDeleted): a missing counter is correct, a
// guessed one is not. Only memcached failures fail an op.
//
// Apply returns nil when every op succeeded, else a *cacheops.ApplyError
// joining the failures (see cacheops.Retryable). A cancelled ctx fails the
// ops not yet started.
func (c *Counters) Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error {
	idx := c.batchable(ops)
	if idx == nil {
		return c.applier.Apply(ctx, ops, results)
	}
	// The recounts together (recount_batch.go), beside the other ops,
	// none of which shares a key with them.
	var wg sync.WaitGroup
	wg.Go(func() { c.applyRecounts(ctx, ops, results, idx) })
	var rest []int
	if len(idx) < len(ops) {
		rest = make([]int, 0, len(ops)-len(idx))
		for i, j := 0, 0; i < len(ops); i++ {
			if j < len(idx) && idx[j] == i {
				j++
				continue
			}
			rest = append(rest, i)
		}
		restOps := make([]rules.Op, len(rest))
		restRes := make([]cacheops.Result, len(rest))
		for k, i := range rest {
			restOps[k] = ops[i]
		}
		c.applier.Apply(ctx, restOps, restRes)
		for k, i := range rest {
			results[i] = restRes[k]
		}
	}
	wg.Wait()
	return cacheops.ResultsError(ops, results)
}

func failed(err error) cacheops.Result {
	return cacheops.Result{Outcome: cacheops.OutcomeFailed, Err: err}
}

// applierRecounter is how the applier recounts: through Counters, which
// fences and stores recounts exactly when it can (RecountOp).
type applierRecounter struct{ c *Counters }

// Count recounts without storing (cacheops.Recounter; RecountOp is used).
func (r applierRecounter) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	n, _, err := r.c.recountAt(ctx, query, args)
	return n, err
}

// RecountOp recounts op's counter (cacheops.OpRecounter). A counter found
// missing is added with its fence when the recount has one (addFenced);
// a possibly wrong one, or an OpRecount, is recounted exactly when
// fencing is on (recountExact). Otherwise the applier stores the plain
// count.
func (r applierRecounter) RecountOp(ctx context.Context, op *rules.Op, missing bool) (int64, cacheops.Result, bool, error) {
	c := r.c
	if !missing && c.fence.snap != nil {
		res, err := c.recountExact(ctx, op)
		return 0, res, err == nil, err
	}
	n, fence, err := c.recountAt(ctx, op.Rule.Query, op.Args)
	if err != nil {
		return 0, cacheops.Result{}, false, err
	}
	if missing && fence.ID != 0 {
		res, err := c.addFenced(ctx, op, n, fence)
		return 0, res, err == nil, err
	}
	return n, cacheops.Result{}, false, nil
}

// deleteItem deletes key because it cannot be kept correct; why names what
// failed (for the error).
func (c *Counters) deleteItem(key, why string) cacheops.Result {
	err := c.delete(key)
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return failed(fmt.Errorf("counters: delete %q after failed %s: %w", key, why, err))
	}
	c.deletes.Add(1)
	return cacheops.Result{Outcome: cacheops.OutcomeDeleted}
}

// Get returns the counter at key. When it is missing (or does not hold a
// number) it runs query with args bound to its '?' placeholders, stores the
// result (add on a miss, so a value a writer stored meanwhile wins; set over
// a non-numeric item) and returns it. With fencing on, the query runs in a
// consistent snapshot and its fence is stored first, as writers do. When
// memcached fails the count comes from the query and nothing is stored.
//
// args may be nil, rules.Value, string, []byte, bool, any Go integer or
// float type; other types are an error. Get needs a Recounter only on a
// miss.
func (c *Counters) Get(ctx context.Context, key, query string, args ...any) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("counters: get %q: %w", key, err)
	}
	it, err := c.get(key)
	store := c.add
	switch {
	case err == nil:
		if n, ok := itemformat.ParseCount(it.Value); ok {
			return n, nil
		}
		c.drifts.Add(1)
		c.log.Warn("counter get found a non-numeric value; counting in MySQL", "key", key, "value_bytes", len(it.Value))
		store = c.set
	case errors.Is(err, memcache.ErrCacheMiss):
	default:
		c.log.Debug("counter get failed; counting in MySQL", "key", key, "err", err)
		store = nil
	}
	if c.rc == nil {
		return 0, fmt.Errorf("counters: get %q: missing and no recounter", key)
	}
	values, err := valuesOf(args)
	if err != nil {
		return 0, fmt.Errorf("counters: get %q: %w", key, err)
	}
	var avoid []uint32
	if it != nil {
		avoid = append(avoid, it.Flags)
	}
	n, fence, err := c.recountAt(ctx, query, values, avoid...)
	if err != nil {
		return 0, fmt.Errorf("counters: get %q: %w", key, err)
	}
	if store != nil && fence.ID != 0 {
		// Like a writer's recount: the fence first, so that daemons skip
		// the deltas this count includes.
		if err := c.storeFence(key, fence); err != nil {
			c.log.Debug("counter fence store failed", "key", key, "err", err)
			store = nil
		}
	}
	if store != nil {
		err := store(c.counterItem(key, n, fence, c.cfg.ReadTTL))
		if err != nil && !errors.Is(err, memcache.ErrNotStored) {
			c.log.Debug("counter store failed", "key", key, "err", err)
		}
		if errors.Is(err, memcache.ErrNotStored) && fence.ID != 0 {
			c.dropLookalike(key, fence)
		}
	}
	return n, nil
}

// dropLookalike deletes the counter at key when its flags equal the id of
// fence, which this process wrote but whose value lost its add: the
// counter was stored by another recount that drew the same id (fence ids
// have 16 bits), and our fence would pass for its own. Missing is correct.
func (c *Counters) dropLookalike(key string, fence Fence) {
	views := make(map[string]FenceView, 1)
	if err := c.viewFences([]string{key}, views, nil); err != nil {
		c.log.Debug("counter fence check failed", "key", key, "err", err)
		return
	}
	if v := views[key]; v.Consistent() && v.Fence == fence {
		c.deleteItem(key, "fence id drawn twice")
	}
}

// valuesOf converts Get's arguments to the values a Recounter binds
// (rules.ValueOf).
func valuesOf(args []any) ([]rules.Value, error) {
	if len(args) == 0 {
		return nil, nil
	}
	out := make([]rules.Value, len(args))
	for i, a := range args {
		v, err := rules.ValueOf(a)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		out[i] = v
	}
	return out, nil
}

func (c *Counters) expiration(ttl time.Duration) int32 {
	return itemformat.Expiration(ttl, c.cfg.Now())
}

// The memcached requests Counters makes, counted.

func (c *Counters) atFaultPoint(verb, key string) {
	if c.faultPoint != nil {
		c.faultPoint(verb, key)
	}
}

func (c *Counters) add(it *memcache.Item) error {
	defer c.roundTrip("add", it.Key)()
	return c.mc.Add(it)
}

func (c *Counters) set(it *memcache.Item) error {
	defer c.roundTrip("set", it.Key)()
	return c.mc.Set(it)
}

func (c *Counters) get(key string) (*memcache.Item, error) {
	defer c.roundTrip("get", key)()
	return c.mc.Get(key)
}

func (c *Counters) getMulti(keys []string) (map[string]*memcache.Item, error) {
	defer c.roundTrip("getmulti", keys[0])()
	return c.mc.GetMulti(keys)
}

func (c *Counters) cas(it *memcache.Item) error {
	defer c.roundTrip("cas", it.Key)()
	return c.mc.CompareAndSwap(it)
}

func (c *Counters) delete(key string) error {
	defer c.roundTrip("delete", key)()
	return c.mc.Delete(key)
}

// roundTrip counts one memcached command (op on key), passes its fault
// point, and returns the function that observes its duration when it is
// done.
func (c *Counters) roundTrip(op, key string) (done func()) {
	c.calls.Add(1)
	c.atFaultPoint(op, key)
	start := time.Now()
	return func() { c.cfg.ObserveRoundTrip.Since(start) }
}
