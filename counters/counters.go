// Package counters keeps cached row counts in memcached: it applies counter
// deltas with incr/decr, recounts from MySQL when a counter is missing or may
// have drifted, and offers the read-side counter get that applications use.
//
// A counter item holds the count as ASCII decimal digits, so memcached's own
// incr and decr change it atomically and no value is ever read, changed and
// written back, except when it is recomputed from MySQL. A missing counter is
// always a correct state; a counter that may be wrong is recounted or
// deleted, never guessed.
package counters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// Recounter runs a count rule's recount query with args bound to its '?'
// placeholders and returns the single integer it yields. *MySQL satisfies
// it. Implementations must be safe for concurrent use.
type Recounter interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
}

// DefaultMaxConcurrency is Config.MaxConcurrency's default.
const DefaultMaxConcurrency = 32

// Config tunes Counters. The zero value gives the documented defaults.
type Config struct {
	// MaxConcurrency bounds the keys one Apply works on at a time. Default
	// 32. The memcache.Client's MaxIdleConns should be at least this, or
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
}

// Counters applies counter ops to memcached and reads counters. It is safe
// for concurrent use.
type Counters struct {
	mc  *memcache.Client
	rc  Recounter
	cfg Config
	log *slog.Logger

	calls, recounts, recountErrors, drifts, deletes atomic.Uint64

	fence fencing

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
		cfg.MaxConcurrency = DefaultMaxConcurrency
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if idle := mc.MaxIdleConns; idle < cfg.MaxConcurrency {
		if idle <= 0 {
			idle = memcache.DefaultMaxIdleConns
		}
		logger.Warn("memcached client keeps fewer idle connections than the counters' concurrency; connections will churn",
			"max_idle_conns", idle, "max_concurrency", cfg.MaxConcurrency)
	}
	c := &Counters{mc: mc, rc: rc, cfg: cfg, log: logger}
	c.initFencing()
	return c
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
	return Stats{
		Calls:         c.calls.Load(),
		Recounts:      c.recounts.Load(),
		RecountErrors: c.recountErrors.Load(),
		Drifts:        c.drifts.Load(),
		Deletes:       c.deletes.Load(),

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
// len(results) must be at least len(ops).
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
// Whenever a recount is needed and cannot be done (no query, no
// Recounter, MySQL down or failing, a negative result) the counter is
// deleted (cacheops.OutcomeDeleted): a missing counter is correct, a
// guessed one is not. Only memcached failures fail an op.
//
// Apply returns nil when every op succeeded, else a *cacheops.ApplyError
// joining the failures (see cacheops.Retryable). A cancelled ctx fails the
// ops not yet started.
func (c *Counters) Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error {
	if len(results) < len(ops) {
		return fmt.Errorf("counters: apply: %d results for %d ops: %w", len(results), len(ops), cacheops.ErrInvalidOp)
	}
	return cacheops.ApplyByKey(ops, results, c.cfg.MaxConcurrency, func(op *rules.Op) cacheops.Result { return c.apply(ctx, op) })
}

func failed(err error) cacheops.Result {
	return cacheops.Result{Outcome: cacheops.OutcomeFailed, Err: err}
}

// apply applies one op.
func (c *Counters) apply(ctx context.Context, op *rules.Op) cacheops.Result {
	if err := ctx.Err(); err != nil {
		return failed(fmt.Errorf("counters: %s %q: %w", op.Kind, op.Key, err))
	}
	if err := cacheops.CheckGuard(ctx); err != nil {
		return failed(fmt.Errorf("counters: %s %q: %w", op.Kind, op.Key, err))
	}
	if op.Rule == nil {
		return failed(fmt.Errorf("counters: %s %q: op has no rule: %w", op.Kind, op.Key, cacheops.ErrInvalidOp))
	}
	switch op.Kind {
	case rules.OpCount:
		return c.count(ctx, op)
	case rules.OpRecount:
		return c.recountAndSet(ctx, op)
	}
	return failed(fmt.Errorf("counters: %s %q: not a counter op: %w", op.Kind, op.Key, cacheops.ErrInvalidOp))
}

// count applies op.Delta (docs/formats.md, counters).
func (c *Counters) count(ctx context.Context, op *rules.Op) cacheops.Result {
	if op.Delta == 0 {
		return cacheops.Result{Outcome: cacheops.OutcomeIncr}
	}
	key := op.Key
	// At most two rounds: the second only re-applies the delta to a
	// counter that another writer or a reader added after our miss.
	for round := 0; ; round++ {
		value, err := c.incrDecr(key, op.Delta)
		switch {
		case err == nil && op.Delta < 0 && value == 0:
			c.drifts.Add(1)
			c.log.Debug("counter decr reached zero; recounting", "key", key, "rule", op.Rule.Name, "delta", op.Delta)
			return c.recountAndSet(ctx, op)
		case err == nil && op.Delta < 0:
			return cacheops.Result{Outcome: cacheops.OutcomeDecr}
		case err == nil:
			return cacheops.Result{Outcome: cacheops.OutcomeIncr}
		case isClientError(err):
			// CLIENT_ERROR: the item is not a decimal number, so it is not
			// a counter value we can trust.
			c.drifts.Add(1)
			c.log.Warn("counter holds a non-numeric value; recounting", "key", key, "rule", op.Rule.Name, "err", err)
			return c.recountAndSet(ctx, op)
		case !errors.Is(err, memcache.ErrCacheMiss):
			return failed(fmt.Errorf("counters: %s %q: %w", deltaVerb(op.Delta), key, err))
		}
		if round > 0 {
			// Added by someone else after our miss, then evicted or deleted
			// before our second round: missing is correct.
			return cacheops.Result{Outcome: cacheops.OutcomeMissing}
		}
		if op.Rule.Query == "" || c.rc == nil {
			return cacheops.Result{Outcome: cacheops.OutcomeMissing}
		}
		n, fence, err := c.recountAt(ctx, op.Rule.Query, op.Args)
		if err != nil {
			return c.deleteAfterRecountError(ctx, op, err)
		}
		if fence.ID != 0 {
			return c.addFenced(ctx, op, n, fence)
		}
		err = c.add(&memcache.Item{Key: key, Value: strconv.AppendInt(nil, n, 10), Expiration: c.expiration(op.Rule.TTL)})
		switch {
		case err == nil:
			return cacheops.Result{Outcome: cacheops.OutcomeLoaded}
		case !errors.Is(err, memcache.ErrNotStored):
			return failed(fmt.Errorf("counters: add %q: %w", key, err))
		}
		// Created since our miss by another writer or a reader: apply the
		// delta to their value.
		c.log.Debug("counter add lost a race; applying the delta again", "key", key, "rule", op.Rule.Name)
	}
}

// recountAndSet recomputes the counter and stores it with set, deleting it
// when it cannot be recomputed.
func (c *Counters) recountAndSet(ctx context.Context, op *rules.Op) cacheops.Result {
	if c.fence.snap != nil {
		return c.recountExact(ctx, op)
	}
	if op.Rule.Query == "" || c.rc == nil {
		return c.deleteItem(op.Key, "recount: no recount query")
	}
	n, err := c.recount(ctx, op)
	if err != nil {
		return c.deleteAfterRecountError(ctx, op, err)
	}
	err = c.set(&memcache.Item{Key: op.Key, Value: strconv.AppendInt(nil, n, 10), Expiration: c.expiration(op.Rule.TTL)})
	if err != nil {
		return failed(fmt.Errorf("counters: set %q: %w", op.Key, err))
	}
	return cacheops.Result{Outcome: cacheops.OutcomeRecounted}
}

// recount runs the rule's recount query for op. A negative count cannot be
// a counter (memcached counters are unsigned) and is an error.
func (c *Counters) recount(ctx context.Context, op *rules.Op) (int64, error) {
	c.recounts.Add(1)
	n, err := c.rc.Count(ctx, op.Rule.Query, op.Args)
	if err == nil {
		c.notePlainRecount()
		// The query may have been long: look again before writing.
		if gerr := cacheops.CheckGuard(ctx); gerr != nil {
			return 0, gerr
		}
	}
	if err == nil && n < 0 {
		err = fmt.Errorf("counters: recount returned %d, a counter cannot be negative", n)
	}
	if err != nil {
		c.recountErrors.Add(1)
		return 0, err
	}
	return n, nil
}

// deleteAfterRecountError deletes a counter whose recount failed: whatever
// it holds now (or will hold if a reader adds it) may be wrong. When ctx was
// cancelled the op still fails after the delete, so that its batch is not
// taken as done.
func (c *Counters) deleteAfterRecountError(ctx context.Context, op *rules.Op, err error) cacheops.Result {
	if errors.Is(err, cacheops.ErrWriteRefused) {
		return failed(fmt.Errorf("counters: recount %q: %w", op.Key, err))
	}
	if gerr := cacheops.CheckGuard(ctx); gerr != nil {
		// The query may have failed after a long wait: look again before
		// deleting.
		return failed(fmt.Errorf("counters: recount %q: %w", op.Key, gerr))
	}
	c.log.Warn("counter recount failed; deleting the counter",
		"key", op.Key, "rule", op.Rule.Name, "retryable", cacheops.Retryable(err), "err", err)
	res := c.deleteItem(op.Key, "recount")
	if ctxErr := ctx.Err(); ctxErr != nil && res.Err == nil {
		return failed(fmt.Errorf("counters: recount %q: %w", op.Key, ctxErr))
	}
	return res
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
		// decr may leave trailing spaces where digits were.
		n, perr := strconv.ParseInt(strings.TrimRight(string(it.Value), " "), 10, 64)
		if perr == nil && n >= 0 {
			return n, nil
		}
		c.drifts.Add(1)
		c.log.Warn("counter holds a non-numeric value; recounting", "key", key, "value_bytes", len(it.Value))
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
	n, fence, err := c.recountAt(ctx, query, values)
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
	}
	return n, nil
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

// isClientError reports whether memcached answered CLIENT_ERROR (for incr
// and decr: the item is not a decimal number).
func isClientError(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "memcache: client error: ")
}

func deltaVerb(delta int64) string {
	if delta < 0 {
		return "decr"
	}
	return "incr"
}

func (c *Counters) expiration(ttl time.Duration) int32 { return cacheops.Expiration(ttl, c.cfg.Now()) }

// The memcached requests Counters makes, counted.

func (c *Counters) atFaultPoint(verb, key string) {
	if c.faultPoint != nil {
		c.faultPoint(verb, key)
	}
}

// incrDecr sends incr (delta > 0) or decr (delta < 0) by |delta|. For
// math.MinInt64, uint64(-delta) is 1<<63, its exact magnitude.
func (c *Counters) incrDecr(key string, delta int64) (uint64, error) {
	c.calls.Add(1)
	c.atFaultPoint("incrdecr", key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	if delta < 0 {
		return c.mc.Decrement(key, uint64(-delta))
	}
	return c.mc.Increment(key, uint64(delta))
}

func (c *Counters) add(it *memcache.Item) error {
	c.calls.Add(1)
	c.atFaultPoint("add", it.Key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.Add(it)
}

func (c *Counters) set(it *memcache.Item) error {
	c.calls.Add(1)
	c.atFaultPoint("set", it.Key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.Set(it)
}

func (c *Counters) get(key string) (*memcache.Item, error) {
	c.calls.Add(1)
	c.atFaultPoint("get", key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.Get(key)
}

func (c *Counters) getMulti(keys []string) (map[string]*memcache.Item, error) {
	c.calls.Add(1)
	c.atFaultPoint("getmulti", keys[0])
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.GetMulti(keys)
}

func (c *Counters) cas(it *memcache.Item) error {
	c.calls.Add(1)
	c.atFaultPoint("cas", it.Key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.CompareAndSwap(it)
}

func (c *Counters) delete(key string) error {
	c.calls.Add(1)
	c.atFaultPoint("delete", key)
	defer c.cfg.ObserveRoundTrip.Since(time.Now())
	return c.mc.Delete(key)
}
