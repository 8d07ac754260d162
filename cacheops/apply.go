package cacheops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// SetLoader loads the full member list of a set (raw, unescaped values)
// for a set rule's load query, with args bound to its '?' placeholders.
// It must be safe for concurrent use.
type SetLoader interface {
	LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error)
}

// Recounter runs a count rule's recount query with args bound to its '?'
// placeholders and returns the single integer it yields. The counters
// package's MySQL satisfies it. It must be safe for concurrent use.
type Recounter interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
}

// OpRecounter is a Recounter that may recount and store a counter itself
// (the counters package: fenced, exact recounts, docs/exact-counters.md).
// The Applier asks it instead of Count, for a counter found missing
// (missing) or possibly wrong, or an OpRecount. stored reports that it
// stored the counter and res is the op's result; else n is the count,
// which the Applier stores as it does Count's (add when missing, else
// set). err is a recount that failed (the Applier then deletes the
// counter). It must be safe for concurrent use, count its own recounts,
// and bound its own time (ctx is the Apply's).
type OpRecounter interface {
	Recounter
	RecountOp(ctx context.Context, op *rules.Op, missing bool) (n int64, res Result, stored bool, err error)
}

// ErrUnknownOutcome marks the failure of a counter op (OpCount) whose delta
// may already be in memcached: the reply to the incr or decr was lost with
// its connection, or a step after an applied delta failed. Applying the op
// again could count the change twice, so the caller must not retry it as
// it is but turn it into a recount (OpRecount) of its key. Find it with
// errors.Is on Result.Err; the error also wraps the cause, so Retryable
// still tells whether waiting may help.
var ErrUnknownOutcome = errors.New("cacheops: counter delta may have been applied")

// RoundTripObserver receives the duration of one memcached round trip,
// e.g. to feed a latency histogram. The nil observer ignores everything.
type RoundTripObserver func(time.Duration)

// Since reports the time elapsed since start, the start of a round trip.
func (o RoundTripObserver) Since(start time.Time) {
	if o != nil {
		o(time.Since(start))
	}
}

// Applier applies planned and coalesced cache ops to memcached: namespace
// bumps, set appends, set rebuilds and deletes, counter deltas and
// recounts, with the miss, race and size handling of each
// (docs/formats.md). It is the one place that decides which memcached
// commands an op kind sends and what each answer means; a transport
// carries the commands: the pipelined meta protocol (NewMetaApplier)
// or the text protocol (NewTextApplier) for mcrouter,
// twemproxy and memcached before 1.6. It is safe for concurrent use.
//
// Each op is a small state machine: its step names the next command
// (steps below), the reply moves it on. A batch goes round by round:
// every pending op sends its next command, all at once (one pipelined
// exchange per connection with the meta transport, concurrent requests
// with the text one), then each op advances by its reply; MySQL steps
// (set loads, recounts) run between rounds. Ops that share a key run in
// slice order, each after the previous one is complete (waves).
//
// # Commands
//
//   - bump: with the meta transport, ma <key> q N<ttl> J<start> D1 (start:
//     itemformat.NamespaceStart of the clock): memcached creates a missing
//     namespace holding J under the item lock, so incr and add-on-miss are
//     one atomic step. With the text transport: incr; on a miss add the
//     start; if another writer added it first, incr again (at most three
//     rounds). A namespace that is not a number is deleted.
//   - set tokens: append (ms MA). A missing set or one that cannot grow
//     is refused (NOT_STORED, or SERVER_ERROR when the tokens alone are
//     too large): then gets looks at it: missing, it is loaded and added
//     (or stays missing without a load query); present, it is compacted
//     with cas and the tokens appended again, and deleted when they still
//     do not fit. A share of successful appends (CompactSample) is
//     followed by gets and, when the set is dirty, a compacting cas.
//   - set rebuild (replay): delete, load, add; a lost add means someone
//     loaded the set after the delete, which is as current.
//   - set delete: delete.
//   - counter: incr, or decr returning the value, which shows whether
//     memcached clamped it at zero. A miss: recount and add; a lost add
//     applies the delta again; a decrement to zero or a non-numeric item
//     is recounted and set; a recount op sets the count; a recount that
//     cannot be run deletes the counter. With RecountElsewhere every
//     recount is left to the caller (OutcomeRecountNeeded).
//   - evidence (bump rules with Rule.Evidence): once the Apply's bumps are
//     done, gets of each master they mark, cas of each that changes,
//     again for those another daemon changed meanwhile
//     (itemformat.MarkEvidence).
//
// # Failures
//
// memcached errors fail the op (see Retryable), so that the batch is
// retried and not committed. A counter delta that may already be in
// memcached fails with ErrUnknownOutcome: the caller must recount rather
// than apply it again. A failed set load or recount (MySQL down, slow
// beyond LoadTimeout, a bad query) does not fail the op: the item is
// deleted and the op reports OutcomeDeleted, because a missing item is
// always correct and a guessed one never is.
type Applier struct {
	tr        transport
	loader    SetLoader
	recounter Recounter
	cfg       Config // defaults filled in
	log       *slog.Logger

	rounds, loads, loadErrors, recounts, recountErrors, compactions, casConflicts atomic.Uint64
	drifts, deletes                                                               atomic.Uint64

	// scratch holds *applyScratch: the memory of one Apply, reused.
	scratch sync.Pool
}

// ApplierStats are cumulative counts since the Applier was created.
type ApplierStats struct {
	// Rounds counts rounds: every pending op sends one command, all
	// servers and connections at once.
	Rounds uint64
	// RoundTrips counts exchanges: one connection's commands of a round
	// written and their replies read (meta), one request (text).
	RoundTrips uint64
	// Commands counts the commands sent.
	Commands uint64
	// Dials counts connections opened; BrokenConns those closed after a
	// failed exchange (meta transport only).
	Dials, BrokenConns uint64
	// Loads counts SetLoader calls, LoadErrors those that failed.
	Loads, LoadErrors uint64
	// Recounts counts Recounter calls, RecountErrors those that failed.
	Recounts, RecountErrors uint64
	// Compactions counts sets rewritten compactly; CASConflicts the
	// compactions abandoned because the set changed after it was read.
	Compactions, CASConflicts uint64
	// Drifts counts counters found possibly wrong: a decrement that
	// reached zero or a non-numeric item.
	Drifts uint64
	// Deletes counts items deleted because they could not be kept correct.
	Deletes uint64
}

// newApplier returns the Applier over tr. Its constructors have filled in
// cfg's defaults and a logger (they need them before, for tr).
func newApplier(tr transport, loader SetLoader, recounter Recounter, cfg Config, logger *slog.Logger) *Applier {
	return &Applier{tr: tr, loader: loader, recounter: recounter, cfg: cfg, log: logger}
}

// NewTextApplier returns an Applier over memcached's text protocol through
// mc: every op kind, counters included (see Config.RecountElsewhere). loader and recounter may be nil: then missing
// sets are never loaded and counters that need a recount stay missing or
// are deleted. A nil logger discards logs. mc's MaxIdleConns should be at
// least cfg.MaxConcurrency, or connections churn.
func NewTextApplier(mc *memcache.Client, loader SetLoader, recounter Recounter, cfg Config, logger *slog.Logger) *Applier {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	warnIdleConns(mc, cfg.MaxConcurrency, logger)
	return newApplier(newTextTransport(mc, cfg.MaxConcurrency, cfg.ObserveRoundTrip), loader, recounter, cfg, logger)
}

// warnIdleConns warns when mc keeps fewer idle connections than the
// requests an Apply has in flight.
func warnIdleConns(mc *memcache.Client, concurrency int, logger *slog.Logger) {
	if idle := mc.MaxIdleConns; idle < concurrency {
		if idle <= 0 {
			idle = memcache.DefaultMaxIdleConns
		}
		logger.Warn("memcached client keeps fewer idle connections than the writer's concurrency; connections will churn",
			"max_idle_conns", idle, "max_concurrency", concurrency)
	}
}

// Stats returns the Applier's counters.
func (a *Applier) Stats() ApplierStats {
	t := a.tr.stats()
	return ApplierStats{
		Rounds:        a.rounds.Load(),
		RoundTrips:    t.roundTrips,
		Commands:      t.commands,
		Dials:         t.dials,
		BrokenConns:   t.brokenConns,
		Loads:         a.loads.Load(),
		LoadErrors:    a.loadErrors.Load(),
		Recounts:      a.recounts.Load(),
		RecountErrors: a.recountErrors.Load(),
		Compactions:   a.compactions.Load(),
		CASConflicts:  a.casConflicts.Load(),
		Drifts:        a.drifts.Load(),
		Deletes:       a.deletes.Load(),
	}
}

// Close closes the transport's own connections (the meta transport's;
// the text transport's client belongs to its caller). Apply calls after
// Close fail.
func (a *Applier) Close() error { return a.tr.close() }

// Probe checks that every server answers what the transport sends (the
// meta transport: metaproto.Pool.Probe, an error wrapping
// ErrNoMetaProtocol when a server does not; the text transport checks
// nothing).
func (a *Applier) Probe(ctx context.Context) error {
	if err := a.tr.probe(ctx); err != nil {
		return fmt.Errorf("cacheops: %w", err)
	}
	return nil
}

// applyScratch is the memory one Apply works in, reused by the next one
// so that applying a batch allocates next to nothing.
type applyScratch struct {
	states      []opState
	occurrences map[string]int
	waves       [][]*opState
	// A round's ops, and their commands and replies.
	ops     []*opState
	cmds    []metaproto.Cmd
	replies []metaproto.Reply
}

// release clears the references the scratch holds (ops, keys, values
// read) before it goes back to the pool.
func (sc *applyScratch) release() {
	clear(sc.states)
	sc.states = sc.states[:0]
	clear(sc.occurrences)
	for i := range sc.waves {
		clear(sc.waves[i])
		sc.waves[i] = sc.waves[i][:0]
	}
	sc.waves = sc.waves[:0]
	clear(sc.ops[:cap(sc.ops)])
	sc.ops = sc.ops[:0]
	clear(sc.cmds[:cap(sc.cmds)])
	clear(sc.replies[:cap(sc.replies)])
}

// Apply applies ops (already coalesced by key) to memcached. results[i]
// receives the outcome of ops[i]; len(results) must be at least len(ops).
//
// It handles OpBump, OpSetAppend (Tokens), OpSetAdd and OpSetRemove (the
// escaped Member), OpSetDelete, replay's OpSetRebuild, and OpCount and
// OpRecount as the counters package does (a zero Delta sends nothing and
// reports OutcomeIncr; with Config.CountersOnly they are the only kinds
// applied). After the bumps of rules with
// evidence it marks their masters. An op without a rule, an invalid key,
// malformed tokens or another kind fails without any request being sent.
// Ops that share a key are applied in slice order. Apply returns nil when
// every op succeeded, else an *ApplyError joining the failures (see
// Retryable and ErrUnknownOutcome). A cancelled ctx fails the ops not yet
// done.
func (a *Applier) Apply(ctx context.Context, ops []rules.Op, results []Result) error {
	if len(results) < len(ops) {
		return fmt.Errorf("cacheops: apply: %d results for %d ops: %w", len(results), len(ops), ErrInvalidOp)
	}
	sc, _ := a.scratch.Get().(*applyScratch)
	if sc == nil {
		sc = &applyScratch{occurrences: make(map[string]int, len(ops))}
	}
	defer func() {
		sc.release()
		a.scratch.Put(sc)
	}()
	if cap(sc.states) < len(ops) {
		sc.states = make([]opState, len(ops))
	}
	states := sc.states[:len(ops)]
	sc.states = states
	// One start for every namespace this Apply creates: the copies of a
	// hot namespace (Rule.Copies) start alike.
	initial := itemformat.NamespaceStart(a.cfg.Now())
	for i := range ops {
		p := &states[i]
		p.op = &ops[i]
		if a.start(p, initial); p.step == stepDone {
			continue
		}
		wave := sc.occurrences[p.op.Key]
		sc.occurrences[p.op.Key] = wave + 1
		if wave == len(sc.waves) {
			if wave < cap(sc.waves) {
				sc.waves = sc.waves[:wave+1]
			} else {
				sc.waves = append(sc.waves, make([]*opState, 0, len(ops)/(wave+1)))
			}
		}
		sc.waves[wave] = append(sc.waves[wave], p)
	}
	for _, wave := range sc.waves {
		a.run(ctx, sc, wave)
	}
	for i := range states {
		results[i] = states[i].result
	}
	a.markEvidence(ctx, evidenceTargets(ops, results), results)
	return ResultsError(ops, results)
}

// run applies one wave of ops (no two share a key) round by round.
func (a *Applier) run(ctx context.Context, sc *applyScratch, pending []*opState) {
	for len(pending) > 0 {
		if err := ctx.Err(); err != nil {
			for _, p := range pending {
				a.fail(p, "", err)
			}
			return
		}
		a.runQueries(ctx, pending)
		a.round(ctx, sc, pending)
		next := pending[:0]
		for _, p := range pending {
			if p.step != stepDone {
				next = append(next, p)
			}
		}
		pending = next
	}
}

// round sends the next command of every pending op at once and advances
// each op by its reply.
func (a *Applier) round(ctx context.Context, sc *applyScratch, pending []*opState) {
	ops := sc.ops[:0]
	for _, p := range pending {
		if p.step != stepDone {
			ops = append(ops, p)
		}
	}
	sc.ops = ops
	if len(ops) == 0 {
		return
	}
	if cap(sc.cmds) < len(ops) {
		sc.cmds = make([]metaproto.Cmd, len(ops))
		sc.replies = make([]metaproto.Reply, len(ops))
	}
	cmds, replies := sc.cmds[:len(ops)], sc.replies[:len(ops)]
	for i, p := range ops {
		a.command(p, &cmds[i])
		p.sends++
	}
	a.send(ctx, cmds, replies)
	for i, p := range ops {
		a.advance(p, &cmds[i], &replies[i])
	}
}

// send is the one way commands reach memcached: one round of them, no two
// for the same key, each reply in replies[i]. Every round of every op and
// of the evidence marks goes through it. It asks ctx's guard (WithGuard)
// first, right before the round leaves, after any MySQL step: when the
// guard refuses, nothing is sent and every command fails with
// ErrWriteRefused, as a command the transport could not send fails.
func (a *Applier) send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply) {
	clear(replies)
	if err := CheckGuard(ctx); err != nil {
		for i := range replies {
			replies[i] = metaproto.Reply{Status: metaproto.Failed, Err: err}
		}
		return
	}
	a.rounds.Add(1)
	a.tr.send(ctx, cmds, replies)
}

// runQueries runs the MySQL steps of the pending ops, at most
// MaxConcurrency at a time; each leaves its op at a memcached step or done.
func (a *Applier) runQueries(ctx context.Context, pending []*opState) {
	var queries []*opState
	for _, p := range pending {
		if p.step >= firstDBStep {
			queries = append(queries, p)
		}
	}
	if len(queries) <= 1 {
		for _, p := range queries {
			a.query(ctx, p)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(a.cfg.MaxConcurrency, len(queries)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(queries) {
					return
				}
				a.query(ctx, queries[i])
			}
		})
	}
	wg.Wait()
}

// markEvidence sets the masters' bits for the bumps of one Apply (after
// the bumps themselves: a reader that sees a bit set must find the
// entity's namespace bumped already): one round of gets of every master,
// one of cas for each that changes, again for those another daemon
// changed meanwhile. A missing master needs nothing: the reader that
// creates it starts a version under which nothing is cached yet.
func (a *Applier) markEvidence(ctx context.Context, targets []*evidenceTarget, results []Result) {
	for attempt := 0; len(targets) > 0; attempt++ {
		if attempt == evidenceAttempts {
			for _, t := range targets {
				t.fail(results, fmt.Errorf("changed by others in each of %d attempts: %w", evidenceAttempts, memcache.ErrCASConflict))
			}
			return
		}
		if err := ctx.Err(); err != nil {
			for _, t := range targets {
				t.fail(results, err)
			}
			return
		}
		gets := make([]metaproto.Cmd, len(targets))
		for i, t := range targets {
			gets[i] = metaproto.Cmd{Verb: metaproto.VerbGet, Key: t.key}
		}
		replies := make([]metaproto.Reply, len(gets))
		a.send(ctx, gets, replies)
		var sets []metaproto.Cmd
		var setTargets []*evidenceTarget
		for i, t := range targets {
			switch rep := &replies[i]; rep.Status {
			case metaproto.EN:
			case metaproto.VA:
				ev := t.rule.Evidence
				next, changed := itemformat.MarkEvidence(rep.Value, t.bits, ev.Bits, ev.MaxSet, a.cfg.Now())
				if changed {
					cmd := metaproto.Cmd{Verb: metaproto.VerbSet, Key: t.key, Data: string(next), CAS: rep.CAS, Flags: rep.Flags}
					a.setTTL(&cmd, t.rule.TTL)
					sets = append(sets, cmd)
					setTargets = append(setTargets, t)
				}
			default:
				t.fail(results, metaproto.ReplyError(rep))
			}
		}
		targets = targets[:0]
		if len(sets) == 0 {
			return
		}
		replies = make([]metaproto.Reply, len(sets))
		a.send(ctx, sets, replies)
		for i, rep := range replies {
			switch rep.Status {
			case metaproto.HD, metaproto.NF, metaproto.NS:
				// Stored, or the master vanished meanwhile (see above).
			case metaproto.EX:
				// Another daemon marked it meanwhile: read it again.
				targets = append(targets, setTargets[i])
			default:
				setTargets[i].fail(results, metaproto.ReplyError(&rep))
			}
		}
	}
}

func (a *Applier) setTTL(cmd *metaproto.Cmd, ttl time.Duration) {
	if e := a.exptime(ttl); e > 0 {
		cmd.TTL, cmd.HasTTL = e, true
	}
}

// exptime converts a rule TTL with itemformat.Expiration.
func (a *Applier) exptime(ttl time.Duration) int64 {
	return int64(itemformat.Expiration(ttl, a.cfg.Now()))
}

// isRefused reports a store memcached would not do: NOT_STORED (missing
// for an append, present for an add, or the grown item beyond the item
// size limit) or a value too large on its own.
func isRefused(rep *metaproto.Reply) bool {
	return rep.Status == metaproto.NS || (rep.Status == metaproto.Failed && isItemTooLarge(rep.Err))
}

// isNonNumeric reports memcached's CLIENT_ERROR answer to an increment or
// decrement of a value that is not a decimal number, as either transport
// returns it.
func isNonNumeric(rep *metaproto.Reply) bool {
	return rep.Status == metaproto.Failed && (metaproto.IsClientError(rep.Err) || isMemcachedClientError(rep.Err))
}
