package cacheops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

// SetLoader loads the full member list of a set (raw, unescaped values)
// for a set rule's load query, with args bound to its '?' placeholders.
// It must be safe for concurrent use.
type SetLoader interface {
	LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error)
}

// WriterConfig tunes a Writer. The zero value gives the documented
// defaults.
type WriterConfig struct {
	// MaxConcurrency bounds the memcached calls one Apply has in flight
	// (ops of different keys run concurrently). Default 32. The
	// memcache.Client's MaxIdleConns should be at least this, or
	// connections are opened and closed all the time.
	MaxConcurrency int
	// CompactRatio: a set is dirty, and compacted, when the tokens that
	// compaction drops (removals, superseded and duplicate adds) make up at
	// least this share of its tokens. Default 0.5; values above 1 never
	// compact on a sample.
	CompactRatio float64
	// CompactSample is the share of successful appends followed by a
	// dirtiness check (a gets, and a cas when dirty). Default 0.01; a
	// negative value disables the check, 1 checks after every append.
	CompactSample float64
	// LoadTimeout bounds one SetLoader call. Default 5s.
	LoadTimeout time.Duration
	// Now is the clock that gives a new namespace its initial value (unix
	// milliseconds) and turns TTLs longer than 30 days into memcached's
	// absolute expiry times. Default time.Now.
	Now func() time.Time
	// ObserveRoundTrip, when set, receives the duration of every
	// memcached round trip (one command with Writer, one pipelined
	// exchange with PipelineWriter); it must be safe for concurrent use.
	ObserveRoundTrip RoundTripObserver
}

// RoundTripObserver receives the duration of one memcached round trip,
// e.g. to feed a latency histogram. The nil observer ignores everything.
type RoundTripObserver func(time.Duration)

// Since reports the time elapsed since start, the start of a round trip.
func (o RoundTripObserver) Since(start time.Time) {
	if o != nil {
		o(time.Since(start))
	}
}

const (
	writerDefaultConcurrency   = 32
	writerDefaultCompactRatio  = 0.5
	writerDefaultCompactSample = 0.01
	writerDefaultLoadTimeout   = 5 * time.Second

	// writerBumpAttempts bounds the incr/add rounds of one bump; more than one
	// is needed only when the namespace is evicted or expires between an
	// add that lost a race and the following incr.
	writerBumpAttempts = 3
)

// Writer applies planned and coalesced cache ops to memcached: namespace
// bumps and set appends, with the miss, race and size handling of each.
// It is safe for concurrent use.
//
// Failure policy: memcached errors fail the op (see Retryable), so that the
// batch is retried and not committed. A failed set load (MySQL down, slow
// beyond LoadTimeout, or a bad query) does not: the set is deleted and the
// op reports OutcomeDeleted, because a missing set is always correct and
// readers load it themselves later, while a guessed set never is. The
// batch therefore never waits for MySQL; failed loads are logged and
// counted in WriterStats.LoadErrors.
type Writer struct {
	mc     *memcache.Client
	loader SetLoader
	cfg    WriterConfig
	log    *slog.Logger

	calls, loads, loadErrors, compactions, casConflicts, deletes atomic.Uint64
}

// WriterStats are cumulative counts since the Writer was created.
type WriterStats struct {
	// Calls is the number of memcached requests (round trips) made.
	Calls uint64
	// Loads counts SetLoader calls, LoadErrors those that failed.
	Loads, LoadErrors uint64
	// Compactions counts sets rewritten compactly; CASConflicts the
	// compactions abandoned because the set changed after the gets.
	Compactions, CASConflicts uint64
	// Deletes counts items deleted because they could not be kept correct.
	Deletes uint64
}

// NewWriter returns a Writer over mc. loader may be nil: then missing sets
// are never loaded, whatever their rule says. A nil logger discards logs.
func NewWriter(mc *memcache.Client, loader SetLoader, cfg WriterConfig, logger *slog.Logger) *Writer {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if idle := mc.MaxIdleConns; idle < cfg.MaxConcurrency {
		if idle <= 0 {
			idle = memcache.DefaultMaxIdleConns
		}
		logger.Warn("memcached client keeps fewer idle connections than the writer's concurrency; connections will churn",
			"max_idle_conns", idle, "max_concurrency", cfg.MaxConcurrency)
	}
	return &Writer{mc: mc, loader: loader, cfg: cfg, log: logger}
}

// Stats returns the Writer's counters.
func (w *Writer) Stats() WriterStats {
	return WriterStats{
		Calls:        w.calls.Load(),
		Loads:        w.loads.Load(),
		LoadErrors:   w.loadErrors.Load(),
		Compactions:  w.compactions.Load(),
		CASConflicts: w.casConflicts.Load(),
		Deletes:      w.deletes.Load(),
	}
}

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
	// (or the Writer no loader); it stays missing, which readers handle.
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
	// (PipelineConfig.RecountElsewhere). Err is nil; the op is not done.
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

// Apply applies ops (already coalesced by key) to memcached. Ops of
// different keys run concurrently, at most MaxConcurrency at a time; ops
// that share a key run one after the other in slice order. results[i]
// receives the outcome of ops[i]; len(results) must be at least len(ops).
//
// It handles OpBump, OpSetAppend (Tokens), OpSetAdd/OpSetRemove (the
// escaped Member), OpSetDelete, and replay's OpSetRebuild; after the bumps
// of rules with evidence it marks their masters (markEvidence); any other
// kind, an op without a rule, an invalid key or
// malformed tokens fail that op without any request being sent. Apply
// returns nil when every op succeeded, else an *ApplyError joining the
// failures (see Retryable). A cancelled ctx fails the ops not yet started.
func (w *Writer) Apply(ctx context.Context, ops []rules.Op, results []Result) error {
	if len(results) < len(ops) {
		return fmt.Errorf("cacheops: apply: %d results for %d ops: %w", len(results), len(ops), ErrInvalidOp)
	}
	// One start for every namespace this Apply creates: the copies of a
	// hot namespace (Rule.Copies) start alike.
	initial := NamespaceStart(w.cfg.Now())
	ApplyByKey(ops, results, w.cfg.MaxConcurrency, func(op *rules.Op) Result { return w.apply(ctx, op, initial) })
	for _, t := range evidenceTargets(ops, results) {
		if err := w.markEvidence(ctx, t); err != nil {
			t.fail(results, err)
		}
	}
	return applyError(ops, results)
}

// markEvidence sets a master's bits for the bumps of one Apply (after the
// bumps themselves: a reader that sees the bit set must find the entity's
// namespace bumped already), with gets and cas. A missing master needs
// nothing: the reader that creates it starts a version under which
// nothing is cached yet.
func (w *Writer) markEvidence(ctx context.Context, t *evidenceTarget) error {
	ev := t.rule.Evidence
	for range evidenceAttempts {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := CheckGuard(ctx); err != nil {
			return err
		}
		it, err := w.gets(t.key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			return nil
		case err != nil:
			return err
		}
		next, changed := MarkEvidence(it.Value, t.bits, ev.Bits, ev.MaxSet, w.cfg.Now())
		if !changed {
			return nil
		}
		err = w.cas(&memcache.Item{Key: t.key, Value: next, Flags: it.Flags, Expiration: w.expiration(t.rule.TTL), CasID: it.CasID})
		switch {
		case err == nil, errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
			// Stored, or the master vanished meanwhile (see above).
			return nil
		case !errors.Is(err, memcache.ErrCASConflict):
			return err
		}
		// Another daemon marked it meanwhile: read it again.
	}
	return fmt.Errorf("changed by others in each of %d attempts: %w", evidenceAttempts, memcache.ErrCASConflict)
}

// ApplyByKey runs apply for every op, ops of different keys concurrently
// (at most maxConcurrency at a time), ops that share a key one after the
// other in slice order, and stores each result in results[i] (len(results)
// must be at least len(ops)). It returns nil when every op succeeded, else
// an *ApplyError joining the failures. Writer and the counters package
// apply their batches with it.
func ApplyByKey(ops []rules.Op, results []Result, maxConcurrency int, apply func(op *rules.Op) Result) error {
	groups := groupOpsByKey(ops)
	workers := min(maxConcurrency, len(groups))
	var next atomic.Int64
	work := func() {
		for {
			g := int(next.Add(1) - 1)
			if g >= len(groups) {
				return
			}
			for _, i := range groups[g] {
				results[i] = apply(&ops[i])
			}
		}
	}
	if workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(work)
		}
		wg.Wait()
	}
	return applyError(ops, results)
}

// applyError returns nil when every op succeeded, else an *ApplyError
// joining the failures.
func applyError(ops []rules.Op, results []Result) error {
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

// withDefaults returns cfg with the documented defaults filled in.
func (cfg WriterConfig) withDefaults() WriterConfig {
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = writerDefaultConcurrency
	}
	if cfg.CompactRatio <= 0 {
		cfg.CompactRatio = writerDefaultCompactRatio
	}
	if cfg.CompactSample == 0 {
		cfg.CompactSample = writerDefaultCompactSample
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = writerDefaultLoadTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// groupOpsByKey returns the indexes of ops grouped by key, groups in order of
// their first op, indexes in op order.
func groupOpsByKey(ops []rules.Op) [][]int {
	groups := make([][]int, 0, len(ops))
	byKey := make(map[string]int, len(ops))
	for i := range ops {
		if g, ok := byKey[ops[i].Key]; ok {
			groups[g] = append(groups[g], i)
			continue
		}
		byKey[ops[i].Key] = len(groups)
		groups = append(groups, []int{i})
	}
	return groups
}

// apply applies one op; initial is the value of a namespace it creates.
func (w *Writer) apply(ctx context.Context, op *rules.Op, initial uint64) Result {
	if err := ctx.Err(); err != nil {
		return failedResult(fmt.Errorf("cacheops: %s %q: %w", op.Kind, op.Key, err))
	}
	if err := CheckGuard(ctx); err != nil {
		return failedResult(fmt.Errorf("cacheops: %s %q: %w", op.Kind, op.Key, err))
	}
	if op.Rule == nil {
		return failedResult(fmt.Errorf("cacheops: %s %q: no rule: %w", op.Kind, op.Key, ErrInvalidOp))
	}
	if err := checkWriteKey(op.Key); err != nil {
		return failedResult(fmt.Errorf("cacheops: %s %q: %w", op.Kind, op.Key, err))
	}
	switch op.Kind {
	case rules.OpBump:
		return w.bump(op, initial)
	case rules.OpSetAppend:
		if err := checkSetTokens(op.Tokens); err != nil {
			return failedResult(fmt.Errorf("cacheops: %s %q: %w", op.Kind, op.Key, err))
		}
		return w.appendSet(ctx, op, []byte(op.Tokens))
	case rules.OpSetAdd, rules.OpSetRemove:
		if err := checkEscapedMember(op.Member); err != nil {
			return failedResult(fmt.Errorf("cacheops: %s %q: %w", op.Kind, op.Key, err))
		}
		tokens := AppendEscapedToken(make([]byte, 0, len(op.Member)+2), op.Kind == rules.OpSetAdd, op.Member)
		return w.appendSet(ctx, op, tokens)
	case rules.OpSetRebuild:
		return w.rebuildSet(ctx, op)
	case rules.OpSetDelete:
		return w.deleteItem(op.Key, "set_delete")
	}
	return failedResult(fmt.Errorf("cacheops: %s %q: kind not applied by the writer: %w", op.Kind, op.Key, ErrInvalidOp))
}

// bump increments a namespace, creating it when missing (docs/formats.md):
// incr; on a miss add the current unix time in milliseconds, so that a
// recreated namespace never reuses an earlier version; if another writer
// added it first, incr again.
func (w *Writer) bump(op *rules.Op, initial uint64) Result {
	key := op.Key
	for range writerBumpAttempts {
		_, err := w.incr(key)
		switch {
		case err == nil:
			return Result{Outcome: OutcomeIncr}
		case isMemcachedClientError(err):
			// Not a number: no version can be derived from it. A missing
			// namespace is correct (readers start a new version).
			w.log.Warn("namespace holds a non-numeric value; deleting it", "key", key, "rule", op.Rule.Name, "err", err)
			return w.deleteItem(key, "incr")
		case !errors.Is(err, memcache.ErrCacheMiss):
			return failedResult(fmt.Errorf("cacheops: incr %q: %w", key, err))
		}
		value := strconv.AppendUint(nil, initial, 10)
		err = w.add(&memcache.Item{Key: key, Value: value, Expiration: w.expiration(op.Rule.TTL)})
		switch {
		case err == nil:
			return Result{Outcome: OutcomeAdded}
		case !errors.Is(err, memcache.ErrNotStored):
			return failedResult(fmt.Errorf("cacheops: add %q: %w", key, err))
		}
		// Another writer created it between our incr and add: count our
		// bump on top of theirs.
	}
	return failedResult(fmt.Errorf("cacheops: bump %q: still missing after %d incr/add rounds: %w", key, writerBumpAttempts, memcache.ErrCacheMiss))
}

// appendSet appends tokens to a set (docs/formats.md).
func (w *Writer) appendSet(ctx context.Context, op *rules.Op, tokens []byte) Result {
	key := op.Key
	err := w.append(key, tokens)
	if err == nil {
		return w.sampleCompaction(op)
	}
	if !errors.Is(err, memcache.ErrNotStored) && !isItemTooLarge(err) {
		return failedResult(fmt.Errorf("cacheops: append %q: %w", key, err))
	}
	// Refused. memcached answers NOT_STORED both when the set is missing
	// and when the grown item would exceed its item size limit (and
	// SERVER_ERROR when the tokens alone exceed it): look at the item.
	it, err := w.gets(key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return w.loadSet(ctx, op, tokens)
	case err != nil:
		return failedResult(fmt.Errorf("cacheops: gets %q: %w", key, err))
	}
	return w.appendAfterCompaction(op, tokens, it)
}

// appendAfterCompaction handles an append refused although the set exists:
// compact it with cas, retry the append once, and delete the set when it
// still cannot take the tokens. If the refused append was a miss and the
// set has been created since, the retry simply succeeds.
func (w *Writer) appendAfterCompaction(op *rules.Op, tokens []byte, it *memcache.Item) Result {
	key := op.Key
	outcome := OutcomeAppended
	compacted, err := w.compactItem(op, it, 0)
	if err != nil {
		return failedResult(err)
	}
	if compacted {
		outcome = OutcomeCompacted
	}
	err = w.append(key, tokens)
	switch {
	case err == nil:
		return Result{Outcome: outcome}
	case errors.Is(err, memcache.ErrNotStored) || isItemTooLarge(err):
		w.log.Warn("set cannot take the appended tokens even after compaction; deleting it",
			"key", key, "rule", op.Rule.Name, "set_bytes", len(it.Value), "token_bytes", len(tokens))
		return w.deleteItem(key, "append")
	}
	return failedResult(fmt.Errorf("cacheops: append %q: %w", key, err))
}

// loadSet handles an append to a missing set: without a load query the
// set stays missing; with one, the full set is loaded and added. The
// loaded set already includes the change (the database committed it
// before the change event was published), so the tokens are appended only
// when another writer created the set first.
func (w *Writer) loadSet(ctx context.Context, op *rules.Op, tokens []byte) Result {
	key := op.Key
	if op.Rule.Query == "" || w.loader == nil {
		return Result{Outcome: OutcomeMissing}
	}
	res, lost := w.loadAndAdd(ctx, op)
	if !lost {
		return res
	}
	// Created by another writer or a reader since our miss; it may have
	// been loaded before the change committed, so append the change.
	err := w.append(key, tokens)
	switch {
	case err == nil:
		return Result{Outcome: OutcomeAppended}
	case errors.Is(err, memcache.ErrNotStored) || isItemTooLarge(err):
		// Gone again, or full: a missing set is the safe state.
		return w.deleteItem(key, "append")
	}
	return failedResult(fmt.Errorf("cacheops: append %q: %w", key, err))
}

// loadAndAdd runs op's load query and adds the full set. lost reports
// that the add lost to a set created meanwhile (res is then unset). When
// MySQL fails the set is deleted (never guess a set; someone may have
// created it meanwhile without the change), and the op is done: the batch
// does not wait for MySQL, readers load the set when it is back. When ctx
// ended first, the op fails and is applied again.
func (w *Writer) loadAndAdd(ctx context.Context, op *rules.Op) (res Result, lost bool) {
	key := op.Key
	w.loads.Add(1)
	loadCtx, cancel := context.WithTimeout(ctx, w.cfg.LoadTimeout)
	members, err := w.loader.LoadMembers(loadCtx, op.Rule.Query, op.Args)
	cancel()
	if gerr := CheckGuard(ctx); gerr != nil {
		// The load may have been long: look again before writing.
		return failedResult(fmt.Errorf("cacheops: load set %q: %w", key, gerr)), false
	}
	if err != nil {
		w.loadErrors.Add(1)
		if ctx.Err() != nil {
			return failedResult(fmt.Errorf("cacheops: load set %q: %w", key, err)), false
		}
		w.log.Warn("set load failed; leaving the set missing",
			"key", key, "rule", op.Rule.Name, "retryable", Retryable(err), "err", err)
		return w.deleteItem(key, "load"), false
	}
	value := encodeLoadedMembers(members)
	err = w.add(&memcache.Item{Key: key, Value: value, Expiration: w.expiration(op.Rule.TTL)})
	switch {
	case err == nil:
		return Result{Outcome: OutcomeLoaded}, false
	case isItemTooLarge(err):
		w.log.Warn("loaded set exceeds memcached's item size; leaving it missing",
			"key", key, "rule", op.Rule.Name, "set_bytes", len(value), "members", len(members))
		return w.deleteItem(key, "add"), false
	case errors.Is(err, memcache.ErrNotStored):
		return Result{}, true
	}
	return failedResult(fmt.Errorf("cacheops: add %q: %w", key, err)), false
}

// rebuildSet replaces a set by what its load query returns now
// (OpSetRebuild, docs/operations.md): delete, load, add. Deleting first,
// instead of storing with set, keeps every concurrent writer's change: a
// daemon appending to the set after the delete finds it missing and loads
// it itself (a load that holds everything ours holds), and a token
// appended after our add corrects the member it names. A lost add means
// someone loaded the set after our delete: that set is as current as
// ours, and the rebuild is done. Without a load query (or a loader) the
// set is only deleted.
func (w *Writer) rebuildSet(ctx context.Context, op *rules.Op) Result {
	key := op.Key
	if err := w.delete(key); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return failedResult(fmt.Errorf("cacheops: delete %q before rebuilding it: %w", key, err))
	}
	if op.Rule.Query == "" || w.loader == nil {
		w.deletes.Add(1)
		return Result{Outcome: OutcomeDeleted}
	}
	res, lost := w.loadAndAdd(ctx, op)
	if lost {
		return Result{Outcome: OutcomeLoaded}
	}
	return res
}

// encodeLoadedMembers encodes raw members as a compact set, escaping them and
// dropping duplicates.
func encodeLoadedMembers(members []string) []byte {
	seen := make(map[string]struct{}, len(members))
	escaped := make([]string, 0, len(members))
	for _, m := range members {
		e := rules.Escape(m)
		if _, dup := seen[e]; dup {
			continue
		}
		seen[e] = struct{}{}
		escaped = append(escaped, e)
	}
	return EncodeSet(escaped)
}

// sampleCompaction follows a successful append: on a CompactSample share of
// appends it compacts the set when dirty. Its failures do not fail the op,
// whose append is done.
func (w *Writer) sampleCompaction(op *rules.Op) Result {
	if w.cfg.CompactSample < 0 || (w.cfg.CompactSample < 1 && rand.Float64() >= w.cfg.CompactSample) {
		return Result{Outcome: OutcomeAppended}
	}
	it, err := w.gets(op.Key)
	if err != nil {
		if !errors.Is(err, memcache.ErrCacheMiss) {
			w.log.Debug("set compaction check failed", "key", op.Key, "err", err)
		}
		return Result{Outcome: OutcomeAppended}
	}
	compacted, err := w.compactItem(op, it, w.cfg.CompactRatio)
	if err != nil {
		w.log.Debug("set compaction failed", "key", op.Key, "err", err)
	}
	if compacted {
		return Result{Outcome: OutcomeCompacted}
	}
	return Result{Outcome: OutcomeAppended}
}

// compactItem rewrites the set it (as returned by gets) without its
// dropped tokens, with cas, when the dropped tokens make up at least ratio
// of them (ratio 0: whenever the item would shrink). compacted is false
// when the set was clean or changed since the gets (then nothing is
// written: a lost cas never overwrites newer appends). The rewrite carries
// the rule's TTL, because memcached cannot keep an item's remaining TTL
// through cas: compaction restarts the TTL.
func (w *Writer) compactItem(op *rules.Op, it *memcache.Item, ratio float64) (compacted bool, err error) {
	st := DecodeSet(it.Value)
	if ratio > 0 && !st.Dirty(ratio) {
		return false, nil
	}
	value := EncodeSet(st.Members)
	if len(value) >= len(it.Value) {
		return false, nil
	}
	err = w.cas(&memcache.Item{Key: it.Key, Value: value, Flags: it.Flags, Expiration: w.expiration(op.Rule.TTL), CasID: it.CasID})
	switch {
	case err == nil:
		w.compactions.Add(1)
		return true, nil
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
		// Appended to, evicted or deleted since the gets: the newer state
		// wins.
		w.casConflicts.Add(1)
		return false, nil
	}
	return false, fmt.Errorf("cacheops: cas %q: %w", it.Key, err)
}

// deleteItem deletes key because it cannot be kept correct; op names the
// request that could not be completed (for the log).
func (w *Writer) deleteItem(key, op string) Result {
	err := w.delete(key)
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return failedResult(fmt.Errorf("cacheops: delete %q after failed %s: %w", key, op, err))
	}
	w.deletes.Add(1)
	return Result{Outcome: OutcomeDeleted}
}

// maxRelativeExpiry is the longest exptime memcached reads as seconds
// from now; larger values are absolute Unix times.
const maxRelativeExpiry = 30 * 24 * 60 * 60

// Expiration converts an item TTL into memcached's exptime field: 0 (or a
// negative ttl) means no expiry; a TTL is rounded up to whole seconds;
// TTLs beyond 30 days become absolute Unix times from now. The writers,
// the counters and the read side all use it.
func Expiration(ttl time.Duration, now time.Time) int32 {
	if ttl <= 0 {
		return 0
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs > maxRelativeExpiry {
		secs += now.Unix()
	}
	return int32(min(secs, math.MaxInt32))
}

func (w *Writer) expiration(ttl time.Duration) int32 { return Expiration(ttl, w.cfg.Now()) }

// checkWriteKey rejects keys memcached cannot take, so that no key can alter
// the request it is sent in.
func checkWriteKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > rules.MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), rules.MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; isSetTokenSeparator(c) {
			return fmt.Errorf("%w: byte 0x%02x at offset %d", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// checkEscapedMember rejects an escaped member that would not form one token.
func checkEscapedMember(member string) error {
	for i := 0; i < len(member); i++ {
		if c := member[i]; isSetTokenSeparator(c) {
			return fmt.Errorf("%w: member has byte 0x%02x at offset %d (not escaped)", ErrInvalidOp, c, i)
		}
	}
	return nil
}

// checkSetTokens checks a joined token string: one or more tokens, each '+'
// or '-', an escaped member, and one space.
func checkSetTokens(tokens string) error {
	if tokens == "" {
		return fmt.Errorf("%w: no set tokens", ErrInvalidOp)
	}
	if tokens[len(tokens)-1] != ' ' {
		return fmt.Errorf("%w: set tokens do not end with a space", ErrInvalidOp)
	}
	start := 0
	for i := 0; i < len(tokens); i++ {
		c := tokens[i]
		switch {
		case i == start:
			if c != '+' && c != '-' {
				return fmt.Errorf("%w: set token at offset %d starts with %q, not '+' or '-'", ErrInvalidOp, i, c)
			}
		case c == ' ':
			start = i + 1
		case isSetTokenSeparator(c):
			return fmt.Errorf("%w: set tokens have byte 0x%02x at offset %d", ErrInvalidOp, c, i)
		}
	}
	return nil
}

// The memcached requests the Writer makes, counted.

func (w *Writer) incr(key string) (uint64, error) {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.Increment(key, 1)
}

func (w *Writer) add(it *memcache.Item) error {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.Add(it)
}

func (w *Writer) append(key string, tokens []byte) error {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.Append(&memcache.Item{Key: key, Value: tokens})
}

func (w *Writer) gets(key string) (*memcache.Item, error) {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.Get(key) // gomemcache's get sends "gets": the item carries its cas id
}

func (w *Writer) cas(it *memcache.Item) error {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.CompareAndSwap(it)
}

func (w *Writer) delete(key string) error {
	w.calls.Add(1)
	defer w.cfg.ObserveRoundTrip.Since(time.Now())
	return w.mc.Delete(key)
}
