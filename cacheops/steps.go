package cacheops

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// The steps of an op, and what each reply makes of it: the command
// sequence of every op kind, for both transports (see Applier).

// step is the next thing an op does.
type step uint8

const (
	stepDone step = iota

	// memcached steps: one command each.
	stepBump           // ma vivify (meta transport)
	stepIncr           // incr of a namespace (text transport)
	stepBumpAdd        // add of a missing namespace (text transport)
	stepAppend         // append, the first try
	stepInspect        // gets after a refused append
	stepCompactCAS     // cas of the compacted set, then append again
	stepAppendAgain    // append after compaction; refused: delete
	stepLoadAdd        // add of a loaded set
	stepAppendAfterAdd // append after the loaded set's add lost a race
	stepSampleGet      // gets: sampled dirtiness check after an append
	stepSampleCAS      // cas of a dirty set
	stepRebuildDelete  // delete before a set is loaded again (rebuild)
	stepDelta          // incr, or decr returning the value
	stepCounterAdd     // add of a recounted missing counter
	stepCounterSet     // set of a recounted counter
	stepDelete         // delete of an item that cannot be kept correct
	stepGenGet         // get of the set's generation before it is loaded
	stepGenAdd         // add of a missing generation before a set is loaded

	// MySQL steps, run between rounds.
	stepLoad       // load a missing set
	stepRecountAdd // recount a missing counter
	stepRecountSet // recount a counter that may be wrong, or for OpRecount
	firstDBStep    = stepLoad
)

const (
	// bumpAttempts bounds the rounds of one bump that find its namespace
	// missing and cannot create it; more than one is needed only when the
	// namespace is evicted or expires between an add that lost a race and
	// the following incr.
	bumpAttempts = 3

	// maxSends bounds the commands one op may send in one Apply; the
	// longest regular path (append, gets, cas, append, delete) takes
	// five, resends after unplaceable errors and bump retries a few more.
	maxSends = 12
)

// opState is the state of one op during Apply.
type opState struct {
	op     *rules.Op
	step   step
	result Result

	// quiet: the next command may be sent with q.
	quiet bool
	// sends counts the commands sent for the op; attempts the bump
	// attempts that found nothing created.
	sends, attempts int
	// tokens are the set tokens to append; data the value of the next
	// store; cas its cas id and flags its client flags.
	tokens string
	data   string
	cas    uint64
	flags  uint32
	// setBytes is the size of the set a refused append found.
	setBytes int
	// outcome is the set outcome so far (appended or compacted).
	outcome Outcome
	// initial is a new namespace's value.
	initial uint64
	// gen is the generation a set is loaded under (read before the load).
	gen uint64
	// deleteWhy says what could not be done, for a delete step's error.
	deleteWhy string
	// raced: a counter's add lost a race and its delta is being applied
	// again; deltaApplied: the counter delta is in memcached; rebuild:
	// the op rebuilds its set (a lost add is then as good as a won one).
	raced, deltaApplied, rebuild bool
}

// start checks op and sets its first step, or its result.
func (a *Applier) start(p *opState, initial uint64) {
	op := p.op
	if op.Rule == nil {
		a.fail(p, "", fmt.Errorf("no rule: %w", ErrInvalidOp))
		return
	}
	if err := itemformat.CheckKey(op.Key); err != nil {
		a.fail(p, "", err)
		return
	}
	if a.cfg.CountersOnly && op.Kind != rules.OpCount && op.Kind != rules.OpRecount {
		a.fail(p, "", fmt.Errorf("not a counter op: %w", ErrInvalidOp))
		return
	}
	switch op.Kind {
	case rules.OpBump:
		p.initial = initial
		if a.tr.vivify() {
			p.step, p.quiet = stepBump, a.tr.quiet()
		} else {
			p.step = stepIncr
		}
		return
	case rules.OpSetAppend:
		if err := itemformat.CheckSetTokens(op.Tokens); err != nil {
			a.fail(p, "", fmt.Errorf("%w: %w", ErrInvalidOp, err))
			return
		}
		p.tokens = op.Tokens
	case rules.OpSetAdd, rules.OpSetRemove:
		if err := itemformat.CheckEscapedMember(op.Member); err != nil {
			a.fail(p, "", fmt.Errorf("%w: %w", ErrInvalidOp, err))
			return
		}
		p.tokens = string(itemformat.AppendEscapedToken(make([]byte, 0, len(op.Member)+2), op.Kind == rules.OpSetAdd, op.Member))
	case rules.OpSetRebuild:
		p.step, p.rebuild = stepRebuildDelete, true
		return
	case rules.OpSetDelete:
		why := "ordered set change"
		if op.Legacy {
			why = "key of an earlier release"
		}
		a.toDelete(p, why)
		return
	case rules.OpCount, rules.OpRecount:
		a.startCounter(p)
		return
	default:
		a.fail(p, "", fmt.Errorf("kind not applied by the cache writer: %w", ErrInvalidOp))
		return
	}
	p.step, p.quiet, p.outcome = stepAppend, a.tr.quiet(), OutcomeAppended
}

// startCounter sets a counter op's first step.
func (a *Applier) startCounter(p *opState) {
	op := p.op
	switch {
	case op.Kind == rules.OpCount && op.Delta == 0:
		a.finish(p, OutcomeIncr)
	case op.Kind == rules.OpCount:
		p.step = stepDelta
	case a.cfg.RecountElsewhere:
		a.finish(p, OutcomeRecountNeeded)
	default:
		p.step = stepRecountSet
	}
}

// command fills cmd with the command of p's step.
func (a *Applier) command(p *opState, cmd *metaproto.Cmd) {
	op := p.op
	*cmd = metaproto.Cmd{Key: op.Key}
	switch p.step {
	case stepBump:
		cmd.Verb, cmd.Quiet, cmd.Delta = metaproto.VerbArith, p.quiet, 1
		cmd.Vivify, cmd.Initial, cmd.TTL = true, p.initial, a.exptime(op.Rule.TTL)
		// Loud, an increment answers HD like a creation; the value tells
		// them apart.
		cmd.ReturnValue = !p.quiet
	case stepIncr:
		cmd.Verb, cmd.Delta = metaproto.VerbArith, 1
	case stepBumpAdd:
		cmd.Verb, cmd.Mode, cmd.Data = metaproto.VerbSet, metaproto.ModeAdd, strconv.FormatUint(p.initial, 10)
		a.setTTL(cmd, op.Rule.TTL)
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		// memcached keeps an item's TTL on append.
		cmd.Verb, cmd.Mode, cmd.Quiet, cmd.Data = metaproto.VerbSet, metaproto.ModeAppend, p.quiet, p.tokens
	case stepInspect, stepSampleGet:
		cmd.Verb = metaproto.VerbGet
	case stepCompactCAS, stepSampleCAS:
		// memcached cannot keep the remaining TTL through a rewrite: the
		// compacted set gets the rule's TTL.
		cmd.Verb, cmd.Data, cmd.CAS, cmd.Flags = metaproto.VerbSet, p.data, p.cas, p.flags
		a.setTTL(cmd, op.Rule.TTL)
	case stepLoadAdd, stepCounterAdd:
		cmd.Verb, cmd.Mode, cmd.Data = metaproto.VerbSet, metaproto.ModeAdd, p.data
		a.setTTL(cmd, op.Rule.TTL)
	case stepCounterSet:
		cmd.Verb, cmd.Data = metaproto.VerbSet, p.data
		a.setTTL(cmd, op.Rule.TTL)
	case stepDelta:
		cmd.Verb, cmd.Mode = metaproto.VerbArith, metaproto.ModeIncr
		if op.Delta < 0 {
			// The value shows whether memcached clamped it at zero. For
			// math.MinInt64, uint64(-Delta) is 1<<63, its magnitude.
			cmd.Mode, cmd.Delta, cmd.ReturnValue = metaproto.ModeDecr, uint64(-op.Delta), true
		} else {
			cmd.Delta = uint64(op.Delta)
		}
	case stepDelete, stepRebuildDelete:
		cmd.Verb = metaproto.VerbDelete
	case stepGenGet:
		cmd.Key, cmd.Verb = op.Rule.Generation, metaproto.VerbGet
	case stepGenAdd:
		cmd.Key, cmd.Verb, cmd.Mode, cmd.Data = op.Rule.Generation, metaproto.VerbSet, metaproto.ModeAdd, strconv.FormatUint(p.gen, 10)
	}
}

// verb names p's step as memcached's text protocol names its request,
// for errors.
func verb(p *opState) string {
	switch p.step {
	case stepBump, stepIncr:
		return "incr"
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		return "append"
	case stepInspect, stepSampleGet:
		return "gets"
	case stepGenGet:
		return "get of the generation"
	case stepGenAdd:
		return "add of the generation"
	case stepCompactCAS, stepSampleCAS:
		return "cas"
	case stepBumpAdd, stepLoadAdd, stepCounterAdd:
		return "add"
	case stepCounterSet:
		return "set"
	case stepDelta:
		if p.op.Delta < 0 {
			return "decr"
		}
		return "incr"
	case stepRebuildDelete:
		return "delete before rebuilding"
	case stepDelete:
		return "delete after failed " + p.deleteWhy
	}
	return p.op.Kind.String()
}

// advance moves p on by the reply to its command.
func (a *Applier) advance(p *opState, cmd *metaproto.Cmd, rep *metaproto.Reply) {
	if p.step == stepDelta && (rep.Status == metaproto.HD || rep.Status == metaproto.VA || rep.Unknown) {
		// Applied, or perhaps applied.
		p.deltaApplied = true
	}
	if rep.Status == metaproto.Failed && rep.Resend {
		// Quiet and perhaps failed, or failed with an error line that
		// could not be placed: send it again, loud.
		if p.sends >= maxSends {
			a.fail(p, verb(p), rep.Err)
			return
		}
		p.quiet = false
		return
	}
	switch p.step {
	case stepBump, stepIncr, stepBumpAdd:
		a.advanceBump(p, cmd, rep)
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		a.advanceAppend(p, rep)
	case stepInspect:
		a.advanceInspect(p, rep)
	case stepCompactCAS, stepSampleCAS:
		a.advanceCompaction(p, rep)
	case stepSampleGet:
		a.advanceSample(p, rep)
	case stepLoadAdd:
		a.advanceLoadAdd(p, rep)
	case stepRebuildDelete:
		a.advanceRebuildDelete(p, rep)
	case stepGenGet, stepGenAdd:
		a.advanceGenGet(p, rep)
	case stepDelta, stepCounterAdd, stepCounterSet:
		a.advanceCounter(p, rep)
	case stepDelete:
		switch rep.Status {
		case metaproto.HD, metaproto.NF:
			a.deletes.Add(1)
			a.finish(p, OutcomeDeleted)
		default:
			a.unexpected(p, rep)
		}
	}
	if p.step != stepDone && p.sends >= maxSends {
		a.fail(p, verb(p), fmt.Errorf("gave up after %d requests", p.sends))
	}
}

// advanceBump: a namespace bump (docs/formats.md). The meta transport
// sends one vivifying ma; the text transport incr, add on a miss, incr
// again when another writer added it first.
func (a *Applier) advanceBump(p *opState, cmd *metaproto.Cmd, rep *metaproto.Reply) {
	op := p.op
	switch {
	case isNonNumeric(rep) && p.step != stepBumpAdd:
		// Not a number: no version can be derived from it. A missing
		// namespace is correct (readers start a new version).
		a.log.Warn("namespace holds a non-numeric value; deleting it", "key", op.Key, "rule", op.Rule.Name, "err", rep.Err)
		a.toDelete(p, "incr")
	case p.step == stepIncr && (rep.Status == metaproto.HD || rep.Status == metaproto.VA):
		a.finish(p, OutcomeIncr)
	case p.step == stepIncr && rep.Status == metaproto.NF:
		p.step = stepBumpAdd
	case p.step == stepBumpAdd && rep.Status == metaproto.HD:
		a.finish(p, OutcomeAdded)
	case p.step == stepBump && rep.Status == metaproto.QuietOK:
		a.finish(p, OutcomeIncr)
	case p.step == stepBump && rep.Status == metaproto.HD && cmd.Quiet:
		// Quiet mode hides an increment but not a creation.
		a.finish(p, OutcomeAdded)
	case p.step == stepBump && rep.Status == metaproto.HD:
		a.finish(p, OutcomeIncr)
	case p.step == stepBump && rep.Status == metaproto.VA:
		if v, ok := itemformat.ParseVersion(rep.Value); ok && v == p.initial {
			a.finish(p, OutcomeAdded)
		} else {
			a.finish(p, OutcomeIncr)
		}
	case rep.Status == metaproto.NS && p.step != stepIncr:
		// The namespace could not be created after the miss (another
		// writer created it, then it was evicted): try again.
		p.attempts++
		if p.attempts >= bumpAttempts {
			a.fail(p, "bump", fmt.Errorf("still missing after %d attempts: %w", p.attempts, memcache.ErrCacheMiss))
			return
		}
		if p.step == stepBumpAdd {
			p.step = stepIncr
		}
	default:
		a.unexpected(p, rep)
	}
}

// advanceAppend: set tokens appended (docs/formats.md, sets).
func (a *Applier) advanceAppend(p *opState, rep *metaproto.Reply) {
	op := p.op
	refused := isRefused(rep)
	switch {
	case rep.Status == metaproto.QuietOK || rep.Status == metaproto.HD:
		switch p.step {
		case stepAppend:
			a.sampleCompaction(p)
		case stepAppendAgain:
			a.finish(p, p.outcome)
		default:
			a.finish(p, OutcomeAppended)
		}
	case refused && p.step == stepAppend:
		// memcached answers NOT_STORED both when the set is missing and
		// when the grown item would exceed its item size limit (and
		// SERVER_ERROR when the tokens alone exceed it): look at it.
		p.step, p.quiet = stepInspect, false
	case refused && p.step == stepAppendAgain:
		a.log.Warn("set cannot take the appended tokens even after compaction; deleting it",
			"key", op.Key, "rule", op.Rule.Name, "set_bytes", p.setBytes, "token_bytes", len(p.tokens))
		a.toDelete(p, "append")
	case refused:
		// The loaded set lost its add race and is now gone again, or
		// full: a missing set is the safe state.
		a.toDelete(p, "append")
	default:
		a.unexpected(p, rep)
	}
}

// advanceInspect: the set after a refused append.
func (a *Applier) advanceInspect(p *opState, rep *metaproto.Reply) {
	switch rep.Status {
	case metaproto.EN:
		if p.op.Rule.Query == "" || a.loader == nil {
			// It stays missing, which readers handle.
			a.finish(p, OutcomeMissing)
		} else {
			a.toLoad(p)
		}
	case metaproto.VA:
		// The set exists: compact it (whenever that shrinks it) and
		// append again. If the refusal was a miss and the set has been
		// created since, the second append simply succeeds.
		p.setBytes = len(rep.Value)
		if compacted, ok := compaction(rep.Value, 0); ok {
			p.step, p.data, p.cas, p.flags = stepCompactCAS, string(compacted), rep.CAS, rep.Flags
		} else {
			p.step = stepAppendAgain
		}
	default:
		a.unexpected(p, rep)
	}
}

// advanceCompaction: the cas of a compacted set. The rewrite never
// overwrites newer appends: a lost cas leaves the newer state.
func (a *Applier) advanceCompaction(p *opState, rep *metaproto.Reply) {
	var compacted bool
	switch rep.Status {
	case metaproto.HD:
		a.compactions.Add(1)
		compacted = true
	case metaproto.EX, metaproto.NF, metaproto.NS:
		// Appended to, evicted or deleted since it was read: the newer
		// state wins.
		a.casConflicts.Add(1)
	default:
		if p.step == stepCompactCAS {
			a.unexpected(p, rep)
			return
		}
		// A failed sampled compaction does not fail the op, whose
		// append is done.
		a.log.Debug("set compaction failed", "key", p.op.Key, "err", rep.Err)
	}
	if p.step == stepSampleCAS {
		if compacted {
			a.finish(p, OutcomeCompacted)
		} else {
			a.finish(p, OutcomeAppended)
		}
		return
	}
	if compacted {
		p.outcome = OutcomeCompacted
	}
	p.step = stepAppendAgain
}

// sampleCompaction follows a successful first append: on a CompactSample
// share of appends the set is read and compacted when dirty.
func (a *Applier) sampleCompaction(p *opState) {
	if a.cfg.CompactSample < 0 || (a.cfg.CompactSample < 1 && rand.Float64() >= a.cfg.CompactSample) {
		a.finish(p, OutcomeAppended)
		return
	}
	p.step = stepSampleGet
}

// advanceSample: the set read after a sampled append; dirty, it is
// compacted. Its failures do not fail the op, whose append is done.
func (a *Applier) advanceSample(p *opState, rep *metaproto.Reply) {
	if rep.Status != metaproto.VA {
		if rep.Status != metaproto.EN {
			a.log.Debug("set compaction check failed", "key", p.op.Key, "err", rep.Err)
		}
		a.finish(p, OutcomeAppended)
		return
	}
	compacted, ok := compaction(rep.Value, a.cfg.CompactRatio)
	if !ok {
		a.finish(p, OutcomeAppended)
		return
	}
	p.step, p.data, p.cas, p.flags = stepSampleCAS, string(compacted), rep.CAS, rep.Flags
}

// compaction returns the compact encoding of the set value when it is
// worth a rewrite: the tokens compaction drops make up at least ratio of
// them (itemformat.SetState.Dirty; ratio 0: whenever the set shrinks).
func compaction(value []byte, ratio float64) (compacted []byte, ok bool) {
	st := itemformat.DecodeSet(value)
	if ratio > 0 && !st.Dirty(ratio) {
		return nil, false
	}
	compacted = st.Compact()
	return compacted, len(compacted) < len(value)
}

// advanceLoadAdd: the add of a loaded set. The loaded set already
// includes the change (the database committed it before the change event
// was published).
func (a *Applier) advanceLoadAdd(p *opState, rep *metaproto.Reply) {
	switch {
	case rep.Status == metaproto.HD:
		a.finish(p, OutcomeLoaded)
	case rep.Status == metaproto.NS && p.rebuild:
		// Someone loaded the set after the rebuild's delete: that set
		// is as current as ours.
		a.finish(p, OutcomeLoaded)
	case rep.Status == metaproto.NS:
		// Created by another writer or a reader since the miss; it may
		// have been loaded before the change committed, so append it.
		p.step = stepAppendAfterAdd
	case rep.Status == metaproto.Failed && isItemTooLarge(rep.Err):
		a.log.Warn("loaded set exceeds memcached's item size; leaving it missing",
			"key", p.op.Key, "rule", p.op.Rule.Name, "set_bytes", len(p.data))
		a.toDelete(p, "add")
	default:
		a.unexpected(p, rep)
	}
}

// toLoad moves a set op on to loading its set: first the generation it is
// loaded under, read before the load query runs, so that a change lost
// during the load leaves the loaded set stale (docs/formats.md,
// "Generations").
func (a *Applier) toLoad(p *opState) {
	if p.op.Rule.Generation == "" {
		p.step = stepLoad
		return
	}
	p.step, p.quiet = stepGenGet, false
}

// advanceGenGet: the generation a set is about to be loaded under, and
// the add of a missing one (docs/formats.md, "Generations"): a new
// generation is the namespace start of now, and a lost add reads the
// winner's. When the generation item holds no generation the set is
// left missing (a reader replaces the item).
func (a *Applier) advanceGenGet(p *opState, rep *metaproto.Reply) {
	switch {
	case p.step == stepGenGet && rep.Status == metaproto.VA:
		if g, ok := itemformat.ParseGeneration(rep.Value); ok {
			p.gen, p.step = g, stepLoad
			return
		}
		a.log.Warn("generation item holds no generation; leaving the set missing", "key", p.op.Rule.Generation, "rule", p.op.Rule.Name)
	case p.step == stepGenGet && rep.Status == metaproto.EN:
		p.gen, p.step = itemformat.NewGeneration(time.Now()), stepGenAdd
		return
	case p.step == stepGenAdd && rep.Status == metaproto.HD:
		p.step = stepLoad
		return
	case p.step == stepGenAdd && rep.Status == metaproto.NS:
		// Created meanwhile: read it (maxSends bounds the rounds).
		p.step = stepGenGet
		return
	default:
		a.unexpected(p, rep)
		return
	}
	if p.rebuild {
		a.deletes.Add(1)
		a.finish(p, OutcomeDeleted)
		return
	}
	a.finish(p, OutcomeMissing)
}

// advanceRebuildDelete: a set rebuild (OpSetRebuild, docs/operations.md)
// deletes the set, then loads and adds it. Deleting first, instead of
// storing with set, keeps every concurrent writer's change: a daemon
// appending after the delete finds the set missing and loads it itself,
// and a token appended after our add corrects the member it names.
// Without a load query (or a loader) the set is only deleted.
func (a *Applier) advanceRebuildDelete(p *opState, rep *metaproto.Reply) {
	switch rep.Status {
	case metaproto.HD, metaproto.NF:
		if p.op.Rule.Query == "" || a.loader == nil {
			a.deletes.Add(1)
			a.finish(p, OutcomeDeleted)
			return
		}
		a.toLoad(p)
	default:
		a.unexpected(p, rep)
	}
}

// advanceCounter: a counter delta and the stores of its recounts
// (docs/formats.md, counters).
func (a *Applier) advanceCounter(p *opState, rep *metaproto.Reply) {
	op := p.op
	switch {
	case p.step == stepCounterAdd && rep.Status == metaproto.HD:
		a.finish(p, OutcomeLoaded)
	case p.step == stepCounterAdd && rep.Status == metaproto.NS:
		// Created since our miss by another writer or a reader (MySQL
		// committed the change before it was published, so the recount
		// included it, but theirs may not have): apply the delta to it.
		a.log.Debug("counter add lost a race; applying the delta again", "key", op.Key, "rule", op.Rule.Name)
		p.step, p.raced = stepDelta, true
	case p.step == stepCounterSet && rep.Status == metaproto.HD:
		a.finish(p, OutcomeRecounted)
	case p.step != stepDelta:
		a.unexpected(p, rep)
	case rep.Status == metaproto.HD && op.Delta > 0:
		a.finish(p, OutcomeIncr)
	case rep.Status == metaproto.VA:
		n, err := strconv.ParseUint(string(rep.Value), 10, 64)
		if err == nil && n > 0 {
			if op.Delta < 0 {
				a.finish(p, OutcomeDecr)
			} else {
				a.finish(p, OutcomeIncr)
			}
			return
		}
		// memcached clamps a decr at zero: a counter that reached zero
		// cannot be told from one that would have gone below. Recount.
		a.drifts.Add(1)
		a.log.Debug("counter decr reached zero; recounting", "key", op.Key, "rule", op.Rule.Name, "delta", op.Delta)
		a.recountDelta(p, stepRecountSet)
	case rep.Status == metaproto.NF:
		if p.raced || op.Rule.Query == "" || (a.recounter == nil && !a.cfg.RecountElsewhere) {
			// No recount query: the counter stays missing. Raced: added
			// by someone else after our miss, then evicted or deleted
			// before the delta got there; missing is correct.
			a.finish(p, OutcomeMissing)
			return
		}
		a.recountDelta(p, stepRecountAdd)
	case isNonNumeric(rep):
		// The item is not a decimal number, so not a counter value to
		// trust.
		a.drifts.Add(1)
		a.log.Warn("counter holds a non-numeric value; recounting", "key", op.Key, "rule", op.Rule.Name, "err", rep.Err)
		a.recountDelta(p, stepRecountSet)
	default:
		a.unexpected(p, rep)
	}
}

// recountDelta moves a delta whose counter must be recounted to step, or
// finishes it with OutcomeRecountNeeded when the caller recounts
// (RecountElsewhere).
func (a *Applier) recountDelta(p *opState, next step) {
	if a.cfg.RecountElsewhere {
		a.finish(p, OutcomeRecountNeeded)
		return
	}
	p.step = next
}

// query runs one MySQL step.
func (a *Applier) query(ctx context.Context, p *opState) {
	qctx, cancel := context.WithTimeout(ctx, a.cfg.LoadTimeout)
	defer cancel()
	switch p.step {
	case stepLoad:
		a.loadSet(ctx, qctx, p)
	case stepRecountAdd, stepRecountSet:
		a.recount(ctx, qctx, p)
	}
}

// loadSet runs a missing set's load query (a failed load deletes the
// set: never guess a set).
func (a *Applier) loadSet(ctx, qctx context.Context, p *opState) {
	op := p.op
	a.loads.Add(1)
	members, err := a.loader.LoadMembers(qctx, op.Rule.Query, op.Args)
	if err != nil {
		a.loadErrors.Add(1)
		// Never guess a set. Someone may have created it since the miss,
		// without this change: delete it.
		a.queryFailed(ctx, p, "load set", "load", "set load failed; leaving the set missing", err)
		return
	}
	if op.Rule.Generation != "" {
		p.data = string(itemformat.EncodeLoadedSetAt(p.gen, members))
	} else {
		p.data = string(itemformat.EncodeLoadedSet(members))
	}
	p.step = stepLoadAdd
}

// recount runs a counter's recount query (a failed recount deletes the
// counter: never guess a count). An OpRecounter may store the count
// itself.
func (a *Applier) recount(ctx, qctx context.Context, p *opState) {
	op := p.op
	if op.Rule.Query == "" || a.recounter == nil {
		// Only a counter that may be wrong gets here without a query
		// (a missing one stays missing): it cannot be kept correct.
		a.toDelete(p, "recount: no recount query")
		return
	}
	var n int64
	var err error
	if or, ok := a.recounter.(OpRecounter); ok {
		var res Result
		var stored bool
		n, res, stored, err = or.RecountOp(ctx, op, p.step == stepRecountAdd)
		switch {
		case err == nil && stored && res.Err != nil:
			a.fail(p, "recount", res.Err)
			return
		case err == nil && stored:
			a.finish(p, res.Outcome)
			return
		}
	} else {
		a.recounts.Add(1)
		n, err = a.recounter.Count(qctx, op.Rule.Query, op.Args)
		if err == nil && n < 0 {
			err = fmt.Errorf("recount returned %d, a counter cannot be negative", n)
		}
		if err != nil {
			a.recountErrors.Add(1)
		}
	}
	if err != nil {
		// Whatever the counter holds now, or will hold if a reader adds
		// it, may be wrong: delete it.
		a.queryFailed(ctx, p, "recount", "recount", "counter recount failed; deleting the counter", err)
		return
	}
	p.data = strconv.FormatInt(n, 10)
	if p.step == stepRecountAdd {
		p.step = stepCounterAdd
	} else {
		p.step = stepCounterSet
	}
}

// queryFailed handles a load or recount that failed with err: when ctx
// ended the op fails (the caller is abandoning the batch, which is
// applied again); else MySQL failed, the item is deleted (a missing item
// is correct, so the op is done and the batch does not wait for MySQL)
// and msg logged. A query whose writes the caller's guard refused
// (WithGuard) fails the op as well: the caller may no longer write. what
// names the query for the error, why the delete.
func (a *Applier) queryFailed(ctx context.Context, p *opState, what, why, msg string, err error) {
	if ctx.Err() != nil || errors.Is(err, ErrWriteRefused) {
		a.fail(p, what, err)
		return
	}
	a.log.Warn(msg, "key", p.op.Key, "rule", p.op.Rule.Name, "retryable", Retryable(err), "err", err)
	a.toDelete(p, why)
}

// toDelete makes p delete its item next, because it cannot be kept
// correct; why names what could not be done.
func (a *Applier) toDelete(p *opState, why string) {
	p.step, p.deleteWhy = stepDelete, why
}

// unexpected fails p with a reply its step does not handle.
func (a *Applier) unexpected(p *opState, rep *metaproto.Reply) {
	a.fail(p, verb(p), metaproto.ReplyError(rep))
}

func (a *Applier) finish(p *opState, outcome Outcome) {
	p.step, p.result = stepDone, Result{Outcome: outcome}
}

// fail ends p with err; verb names the request that failed ("" when none
// was made). A counter op whose delta may be in memcached fails with
// ErrUnknownOutcome.
func (a *Applier) fail(p *opState, verb string, err error) {
	op := p.op
	if verb == "" {
		verb = op.Kind.String()
	}
	if op.Kind == rules.OpCount && p.deltaApplied {
		err = fmt.Errorf("cacheops: %s %q: %w: %w", verb, op.Key, ErrUnknownOutcome, err)
	} else {
		err = fmt.Errorf("cacheops: %s %q: %w", verb, op.Key, err)
	}
	p.step, p.result = stepDone, failedResult(err)
}
