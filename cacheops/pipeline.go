package cacheops

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

// Recounter runs a count rule's recount query with args bound to its '?'
// placeholders and returns the single integer it yields. The counters
// package's MySQL satisfies it. It must be safe for concurrent use.
type Recounter interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
}

// ErrUnknownOutcome marks the failure of a counter op (OpCount) whose delta
// may already be in memcached: the reply to the incr or decr was lost with
// its connection, or a step after an applied delta failed. Applying the op
// again could count the change twice, so the caller must not retry it as
// it is but turn it into a recount (OpRecount) of its key. Find it with
// errors.Is on Result.Err; the error also wraps the cause, so Retryable
// still tells whether waiting may help.
var ErrUnknownOutcome = errors.New("cacheops: counter delta may have been applied")

// PipelineConfig tunes a PipelineWriter. The zero value gives the
// documented defaults.
type PipelineConfig struct {
	// WriterConfig's fields mean what they mean for Writer, except
	// MaxConcurrency, which bounds the set loads and recounts (MySQL
	// queries) run at once between rounds (default 32), and LoadTimeout,
	// which bounds a recount too (default 5s).
	WriterConfig
	// ConnsPerServer is the number of persistent connections to each
	// memcached server: the most connections one server's share of a
	// round is spread over, and the most that exist at once (concurrent
	// Apply calls wait for a free one). Default 8: the daemon applies
	// the batches of several partitions at once, and with 2 each batch
	// of a round took both while the others waited for a connection.
	ConnsPerServer int
	// MinCommandsPerConn: one server's commands of a round are spread
	// over one more connection for every this many. Default 256.
	MinCommandsPerConn int
	// Timeout bounds dialing and each exchange (writing one connection's
	// share of a round and reading its replies). Default 1s.
	Timeout time.Duration
	// Dial opens a connection to a server; default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RecountElsewhere leaves every counter recount to the caller: a
	// delta whose counter must be recounted (missing while its rule has a
	// recount query, a decr clamped at zero, a value that is not a
	// number) finishes with OutcomeRecountNeeded instead, and so does an
	// OpRecount, without any request. The daemon sets
	// it when the counters package fences recounts
	// (docs/exact-counters.md): deltas go through the pipeline, recounts
	// through the counters package.
	RecountElsewhere bool
}

const (
	pipelineDefaultConnsPerServer = 8
	pipelineDefaultMinCommands    = 256
	pipelineDefaultTimeout        = time.Second

	// pipelineMaxSends bounds the commands one op may send in one Apply;
	// the longest regular path (append, get, cas, append, delete) takes
	// five, resends after unplaceable errors and bump retries a few more.
	pipelineMaxSends = 12
)

// PipelineWriter applies planned and coalesced cache ops to memcached over
// its meta protocol, pipelined: bumps, set appends and counter deltas, with
// the miss, race and size handling of Writer and of the counters package
// (docs/formats.md). It is safe for concurrent use.
//
// # Why a pipeline, and why its own client
//
// gomemcache makes one round trip per request, so a writer on it is
// bounded by round trips (on the order of 10^5 requests/s on a small
// machine) however many goroutines it runs. A batch of the daemon holds
// thousands of independent ops, so PipelineWriter writes all the commands
// for one server in one buffer, reads the replies in bulk, and needs a
// second round only for the few ops that missed.
//
// The Go meta-protocol clients that exist were weighed against what the
// daemon needs: the same server for a key as gomemcache (the read side
// uses gomemcache: crc32-IEEE of the key modulo the server count, as in
// memcache.ServerList.PickServer), append mode, arithmetic with
// autovivify, quiet mode with opaque tokens, and active maintenance.
// github.com/QuangTung97/go-memcache, maintained, pipelines mg, ms and md
// but has no arithmetic command at all (neither bumps nor counters), no ms
// mode (so no append), no quiet mode (replies are matched by position),
// and talks to one address per client, so routing would have to be
// rebuilt around it. github.com/jsp-lqk/metapipe-memcached offers
// get/set/add/replace/delete and touch, no append mode and no arithmetic,
// routes keys with an FNV-1a jump hash, so its server for a key differs
// from gomemcache's, and calls itself experimental. Either would need
// most of what follows added to it.
//
// So PipelineWriter speaks the protocol itself (meta.go), a few hundred
// lines: server selection is delegated to a memcache.ServerSelector — pass
// the Selector (or memcache.ServerList) the gomemcache clients use and routing is
// identical by construction — and each server has a small pool of
// persistent connections. It needs memcached 1.6 with ma autovivify and
// opaque tokens on every reply, EN included (tested with 1.6.18).
//
// # Commands
//
//   - bump: ma <key> q N<ttl> J<start> D1 (start: NamespaceStart of the
//     clock). memcached creates a missing
//     namespace holding J (the delta is not applied to it) under the item
//     lock, so incr and add-on-miss are one atomic step and there is no add
//     race. Quiet mode hides an increment but not a creation, which is
//     reported as HD: OutcomeIncr and OutcomeAdded stay apart.
//   - set tokens: ms <key> <len> MA q. A missing set or one that cannot
//     grow answers NS (or SERVER_ERROR when the tokens alone are too large):
//     then mg c v looks at it, and the Writer's path follows: load and add
//     (ms ME) or leave it missing; compact with ms C<cas>, append again,
//     delete when it still does not fit.
//   - counter: ma <key> MI D<n>, or MD D<n> v for a decrement, whose value
//     shows whether memcached clamped it at zero. NF on a miss: recount and
//     add; a lost add applies the delta again; a decrement to zero or a
//     non-numeric item is recounted and set; a recount op sets the count;
//     a recount that cannot be run deletes the counter.
//   - evidence (bump rules with Rule.Evidence): once the round's bumps
//     are done, one pipelined mg c v of each master they mark, one ms
//     C<cas> of each that changes (bits set, or the master rolled), again
//     for those another daemon changed meanwhile (MarkEvidence).
//
// Only bumps and set appends are sent quiet: they are the bulk of a batch,
// and sending one again is harmless (an extra bump, tokens that leave the
// set as it is). memcached answers errors without the opaque token, so an
// error is placed by its position among the replies and by its kind (only
// an ma answers "non-numeric value", only an ms "object too large"). When
// several quiet commands could have sent it, they are all sent again, loud.
// Every other command, the counter deltas above all, is answered
// individually and is never repeated blindly.
//
// # Failures
//
// A connection whose exchange fails (I/O error, timeout, cancelled ctx,
// replies that do not fit the commands) is closed. Its ops without a reply
// fail with the cause, retryable unless ctx was cancelled; the caller
// applies the batch again, which is safe for bumps and set tokens
// (README, "How it works"). A counter delta without a reply may or may not have been
// applied: its op fails with ErrUnknownOutcome, and the caller must turn it
// into a recount rather than apply the delta again. As with Writer,
// failed set loads and recounts do not fail ops: the item is deleted.
//
// A batch takes one round per step of its slowest op: one round trip per
// connection when nothing misses. Ops that share a key are applied in
// slice order, each after the previous one is complete.
type PipelineWriter struct {
	pool      *metaPool
	loader    SetLoader
	recounter Recounter
	cfg       PipelineConfig
	log       *slog.Logger

	rounds, roundTrips, commands, dials, brokenConns                      atomic.Uint64
	loads, loadErrors, recounts, recountErrors, compactions, casConflicts atomic.Uint64
	drifts, deletes                                                       atomic.Uint64

	// scratch holds *pipeScratch: the memory of one Apply, reused.
	scratch sync.Pool
}

// pipeScratch is the memory one Apply works in, reused by the next one so
// that applying a batch allocates next to nothing.
type pipeScratch struct {
	states      []pipeOp
	occurrences map[string]int
	waves       [][]*pipeOp
	// A round's ops by server, its exchanges, and the commands and
	// replies the exchanges take their shares of.
	byServer  []serverOps
	exchanges []pipeExchange
	cmds      []metaCmd
	replies   []metaReply
}

// serverOps are a round's ops for one server.
type serverOps struct {
	server *metaServer
	ops    []*pipeOp
}

// release clears the references the scratch holds (ops, keys, values
// read) before it goes back to the pool.
func (sc *pipeScratch) release() {
	clear(sc.states)
	sc.states = sc.states[:0]
	clear(sc.occurrences)
	for i := range sc.waves {
		clear(sc.waves[i])
		sc.waves[i] = sc.waves[i][:0]
	}
	sc.waves = sc.waves[:0]
	for i := range sc.byServer {
		clear(sc.byServer[i].ops[:cap(sc.byServer[i].ops)])
	}
	clear(sc.exchanges[:cap(sc.exchanges)])
	sc.exchanges = sc.exchanges[:0]
	clear(sc.cmds[:cap(sc.cmds)])
	clear(sc.replies[:cap(sc.replies)])
}

// PipelineStats are cumulative counts since the PipelineWriter was created.
type PipelineStats struct {
	// Rounds counts rounds: every pending op sends one command, all
	// servers and connections at once.
	Rounds uint64
	// RoundTrips counts exchanges: one connection's commands of a round
	// written and their replies read.
	RoundTrips uint64
	// Commands counts the commands sent.
	Commands uint64
	// Dials counts connections opened; BrokenConns those closed after a
	// failed exchange.
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

// NewPipelineWriter returns a PipelineWriter that sends each key to the
// server servers picks for it; give it the memcache.ServerList (or other
// selector) of the gomemcache clients that read the same items. loader and
// recounter may be nil: then missing sets are never loaded and counters
// that need a recount stay missing or are deleted. A nil logger discards
// logs. Close it to close its connections.
func NewPipelineWriter(servers memcache.ServerSelector, loader SetLoader, recounter Recounter, cfg PipelineConfig, logger *slog.Logger) *PipelineWriter {
	cfg.WriterConfig = cfg.WriterConfig.withDefaults()
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = pipelineDefaultConnsPerServer
	}
	if cfg.MinCommandsPerConn <= 0 {
		cfg.MinCommandsPerConn = pipelineDefaultMinCommands
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = pipelineDefaultTimeout
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	pool := &metaPool{sel: servers, connsPerServer: cfg.ConnsPerServer, timeout: cfg.Timeout, dial: cfg.Dial,
		servers: make(map[string]*metaServer), byAddr: make(map[net.Addr]*metaServer)}
	return &PipelineWriter{pool: pool, loader: loader, recounter: recounter, cfg: cfg, log: logger}
}

// Close closes the idle connections, and the others as their exchanges
// end. Apply calls after Close fail.
func (w *PipelineWriter) Close() error {
	w.pool.close()
	return nil
}

// Stats returns the PipelineWriter's counters.
func (w *PipelineWriter) Stats() PipelineStats {
	return PipelineStats{
		Rounds:        w.rounds.Load(),
		RoundTrips:    w.roundTrips.Load(),
		Commands:      w.commands.Load(),
		Dials:         w.dials.Load(),
		BrokenConns:   w.brokenConns.Load(),
		Loads:         w.loads.Load(),
		LoadErrors:    w.loadErrors.Load(),
		Recounts:      w.recounts.Load(),
		RecountErrors: w.recountErrors.Load(),
		Compactions:   w.compactions.Load(),
		CASConflicts:  w.casConflicts.Load(),
		Drifts:        w.drifts.Load(),
		Deletes:       w.deletes.Load(),
	}
}

// pipeStep is the next thing an op does.
type pipeStep uint8

const (
	pipeDone pipeStep = iota

	// memcached steps: one command each.
	stepBump           // ma vivify
	stepAppend         // ms MA, the first try
	stepInspect        // mg c v after a refused append
	stepCompactCAS     // ms C<cas> of the compacted set, then append again
	stepAppendAgain    // ms MA after compaction; refused: delete
	stepLoadAdd        // ms ME of a loaded set
	stepAppendAfterAdd // ms MA after the loaded set's add lost a race
	stepSampleGet      // mg c v: sampled dirtiness check after an append
	stepSampleCAS      // ms C<cas> of a dirty set
	stepDelta          // ma MI or MD v
	stepCounterAdd     // ms ME of a recounted missing counter
	stepCounterSet     // ms of a recounted counter
	stepDelete         // md

	// MySQL steps, run between rounds.
	stepLoad        // load a missing set
	stepRecountAdd  // recount a missing counter
	stepRecountSet  // recount a counter that may be wrong, or for OpRecount
	pipeFirstDBStep = stepLoad
)

// pipeOp is the state of one op during Apply.
type pipeOp struct {
	op     *rules.Op
	idx    int
	server *metaServer
	step   pipeStep
	result Result

	// quiet: the next command may be sent with q.
	quiet bool
	// sends counts the commands sent for the op; attempts the bump
	// attempts that found nothing created.
	sends, attempts int
	// tokens are the set tokens to append; data the value of the next
	// ms; cas its cas id.
	tokens string
	data   string
	cas    uint64
	// outcome is the set outcome so far (appended or compacted).
	outcome Outcome
	// initial is a new namespace's value.
	initial uint64
	// deleteWhy says what could not be done, for a delete step's error.
	deleteWhy string
	// raced: a counter's add lost a race and its delta is being applied
	// again; deltaApplied: the counter delta is in memcached.
	raced, deltaApplied bool
}

// Apply applies ops (already coalesced by key) to memcached. results[i]
// receives the outcome of ops[i]; len(results) must be at least len(ops).
//
// It handles OpBump, OpSetAppend, OpSetAdd and OpSetRemove as Writer does,
// and OpCount and OpRecount as the counters package does (a zero Delta
// sends nothing and reports OutcomeIncr). An op without a rule, an invalid
// key, malformed tokens or another kind fails without any request being
// sent. Ops that share a key are applied in slice order. Apply returns nil
// when every op succeeded, else an *ApplyError joining the failures (see
// Retryable and ErrUnknownOutcome). A cancelled ctx fails the ops not yet
// done.
func (w *PipelineWriter) Apply(ctx context.Context, ops []rules.Op, results []Result) error {
	if len(results) < len(ops) {
		return fmt.Errorf("cacheops: apply: %d results for %d ops: %w", len(results), len(ops), ErrInvalidOp)
	}
	sc, _ := w.scratch.Get().(*pipeScratch)
	if sc == nil {
		sc = &pipeScratch{occurrences: make(map[string]int, len(ops))}
	}
	defer func() {
		sc.release()
		w.scratch.Put(sc)
	}()
	if cap(sc.states) < len(ops) {
		sc.states = make([]pipeOp, len(ops))
	}
	states := sc.states[:len(ops)]
	sc.states = states
	initial := NamespaceStart(w.cfg.Now())
	for i := range ops {
		p := &states[i]
		p.op, p.idx = &ops[i], i
		if w.start(p, initial); p.step == pipeDone {
			continue
		}
		wave := sc.occurrences[p.op.Key]
		sc.occurrences[p.op.Key] = wave + 1
		if wave == len(sc.waves) {
			if wave < cap(sc.waves) {
				sc.waves = sc.waves[:wave+1]
			} else {
				sc.waves = append(sc.waves, make([]*pipeOp, 0, len(ops)/(wave+1)))
			}
		}
		sc.waves[wave] = append(sc.waves[wave], p)
	}
	for _, wave := range sc.waves {
		w.run(ctx, sc, wave)
	}
	for i := range states {
		results[i] = states[i].result
	}
	w.markEvidence(ctx, evidenceTargets(ops, results), results)
	return applyError(ops, results)
}

// markEvidence sets the masters' bits for the bumps of one Apply (after
// the bumps themselves: a reader that sees a bit set must find the
// entity's namespace bumped already): one pipelined mg of every master,
// one ms with its cas for each that changes, again for those another
// daemon changed meanwhile. A missing master needs nothing: the reader
// that creates it starts a version under which nothing is cached yet.
func (w *PipelineWriter) markEvidence(ctx context.Context, targets []*evidenceTarget, results []Result) {
	for attempt := 0; len(targets) > 0; attempt++ {
		if attempt == evidenceAttempts {
			for _, t := range targets {
				t.fail(results, fmt.Errorf("changed by others in each of %d attempts: %w", evidenceAttempts, memcache.ErrCASConflict))
			}
			return
		}
		gets := make([]metaCmd, len(targets))
		for i, t := range targets {
			gets[i] = metaCmd{verb: metaGet, key: t.key}
		}
		replies := w.evidenceExchange(ctx, gets)
		var sets []metaCmd
		var setTargets []*evidenceTarget
		for i, t := range targets {
			switch rep := &replies[i]; rep.status {
			case metaEN:
			case metaVA:
				ev := t.rule.Evidence
				next, changed := MarkEvidence(rep.value, t.bits, ev.Bits, ev.MaxSet, w.cfg.Now())
				if changed {
					cmd := metaCmd{verb: metaSet, key: t.key, data: string(next), cas: rep.cas}
					w.setTTL(&cmd, t.rule.TTL)
					sets = append(sets, cmd)
					setTargets = append(setTargets, t)
				}
			default:
				t.fail(results, metaReplyError(rep))
			}
		}
		targets = targets[:0]
		if err := CheckGuard(ctx); err != nil && len(sets) > 0 {
			for _, t := range setTargets {
				t.fail(results, err)
			}
			return
		}
		for i, rep := range w.evidenceExchange(ctx, sets) {
			switch rep.status {
			case metaHD, metaNF, metaNS:
				// Stored, or the master vanished meanwhile (see above).
			case metaEX:
				targets = append(targets, setTargets[i])
			default:
				setTargets[i].fail(results, metaReplyError(&rep))
			}
		}
	}
}

// evidenceExchange sends cmds with the writer's connections and counts
// them as a round.
func (w *PipelineWriter) evidenceExchange(ctx context.Context, cmds []metaCmd) []metaReply {
	if len(cmds) == 0 {
		return nil
	}
	start := time.Now()
	replies, err := w.pool.do(ctx, w.cfg.Timeout, cmds)
	w.cfg.ObserveRoundTrip.Since(start)
	w.rounds.Add(1)
	w.commands.Add(uint64(len(cmds)))
	if err != nil {
		w.log.Debug("memcached exchange failed", "commands", len(cmds), "err", err)
	}
	return replies
}

// metaReplyError returns the error of a reply that is neither what the
// command hoped for nor one of its expected refusals.
func metaReplyError(rep *metaReply) error {
	if rep.err != nil {
		return rep.err
	}
	return fmt.Errorf("%w: status %d", errMetaProtocol, rep.status)
}

// start checks op and sets its first step, or its result.
func (w *PipelineWriter) start(p *pipeOp, initial uint64) {
	op := p.op
	if op.Rule == nil {
		w.fail(p, "", fmt.Errorf("no rule: %w", ErrInvalidOp))
		return
	}
	if err := checkWriteKey(op.Key); err != nil {
		w.fail(p, "", err)
		return
	}
	switch op.Kind {
	case rules.OpBump:
		p.step, p.quiet, p.initial = stepBump, true, initial
	case rules.OpSetAppend:
		if err := checkSetTokens(op.Tokens); err != nil {
			w.fail(p, "", err)
			return
		}
		p.step, p.quiet, p.tokens, p.outcome = stepAppend, true, op.Tokens, OutcomeAppended
	case rules.OpSetAdd, rules.OpSetRemove:
		if err := checkEscapedMember(op.Member); err != nil {
			w.fail(p, "", err)
			return
		}
		p.tokens = string(AppendEscapedToken(make([]byte, 0, len(op.Member)+2), op.Kind == rules.OpSetAdd, op.Member))
		p.step, p.quiet, p.outcome = stepAppend, true, OutcomeAppended
	case rules.OpCount:
		if op.Delta == 0 {
			w.finish(p, OutcomeIncr)
			return
		}
		p.step = stepDelta
	case rules.OpRecount:
		if w.cfg.RecountElsewhere {
			w.finish(p, OutcomeRecountNeeded)
			return
		}
		p.step = stepRecountSet
	case rules.OpSetDelete:
		w.toDelete(p, "ordered set change")
	default:
		w.fail(p, "", fmt.Errorf("kind not applied by the pipeline writer: %w", ErrInvalidOp))
		return
	}
	s, err := w.pool.server(op.Key)
	if err != nil {
		w.fail(p, "", err)
		return
	}
	p.server = s
}

// run applies one wave of ops (no two share a key) round by round.
func (w *PipelineWriter) run(ctx context.Context, sc *pipeScratch, pending []*pipeOp) {
	for len(pending) > 0 {
		if err := ctx.Err(); err != nil {
			for _, p := range pending {
				w.fail(p, "", err)
			}
			return
		}
		w.runQueries(ctx, pending)
		// After the MySQL steps, which may be slow, and right before the
		// round is sent (WithGuard).
		if err := CheckGuard(ctx); err != nil {
			for _, p := range pending {
				w.fail(p, "", err)
			}
			return
		}
		w.round(ctx, sc, pending)
		next := pending[:0]
		for _, p := range pending {
			if p.step != pipeDone {
				next = append(next, p)
			}
		}
		pending = next
	}
}

// runQueries runs the MySQL steps of the pending ops, at most
// MaxConcurrency at a time; each leaves its op at a memcached step or done.
func (w *PipelineWriter) runQueries(ctx context.Context, pending []*pipeOp) {
	var queries []*pipeOp
	for _, p := range pending {
		if p.step >= pipeFirstDBStep {
			queries = append(queries, p)
		}
	}
	if len(queries) <= 1 {
		for _, p := range queries {
			w.query(ctx, p)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(w.cfg.MaxConcurrency, len(queries)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(queries) {
					return
				}
				w.query(ctx, queries[i])
			}
		})
	}
	wg.Wait()
}

// query runs one MySQL step.
func (w *PipelineWriter) query(ctx context.Context, p *pipeOp) {
	op := p.op
	qctx, cancel := context.WithTimeout(ctx, w.cfg.LoadTimeout)
	defer cancel()
	switch p.step {
	case stepLoad:
		w.loads.Add(1)
		members, err := w.loader.LoadMembers(qctx, op.Rule.Query, op.Args)
		if err != nil {
			w.loadErrors.Add(1)
			if ctx.Err() != nil {
				// The caller is abandoning the batch; it will be applied again.
				w.fail(p, "load set", err)
				return
			}
			// MySQL failed: never guess a set. Someone may have created it
			// since the miss, without this change: delete it. A missing set
			// is correct, so the op is done and the batch does not wait for
			// MySQL.
			w.log.Warn("set load failed; leaving the set missing",
				"key", op.Key, "rule", op.Rule.Name, "retryable", Retryable(err), "err", err)
			w.toDelete(p, "load")
			return
		}
		p.data, p.step = string(encodeLoadedMembers(members)), stepLoadAdd
	case stepRecountAdd, stepRecountSet:
		if op.Rule.Query == "" || w.recounter == nil {
			// Only a counter that may be wrong gets here without a query
			// (a missing one stays missing): it cannot be kept correct.
			w.toDelete(p, "recount: no recount query")
			return
		}
		w.recounts.Add(1)
		n, err := w.recounter.Count(qctx, op.Rule.Query, op.Args)
		if err == nil && n < 0 {
			err = fmt.Errorf("recount returned %d, a counter cannot be negative", n)
		}
		if err != nil {
			w.recountErrors.Add(1)
			if ctx.Err() != nil {
				w.fail(p, "recount", err)
				return
			}
			// Whatever the counter holds now, or will hold if a reader
			// adds it, may be wrong: delete it.
			w.log.Warn("counter recount failed; deleting the counter",
				"key", op.Key, "rule", op.Rule.Name, "retryable", Retryable(err), "err", err)
			w.toDelete(p, "recount")
			return
		}
		p.data = strconv.FormatInt(n, 10)
		if p.step == stepRecountAdd {
			p.step = stepCounterAdd
		} else {
			p.step = stepCounterSet
		}
	}
}

// pipeExchange is one connection's share of a round; cmds and replies
// have one entry per op.
type pipeExchange struct {
	server  *metaServer
	ops     []*pipeOp
	cmds    []metaCmd
	replies []metaReply
}

// round sends the next command of every pending op, all servers and
// connections at once, and advances each op by its reply.
func (w *PipelineWriter) round(ctx context.Context, sc *pipeScratch, pending []*pipeOp) {
	byServer := sc.byServer[:0]
	total := 0
	for _, p := range pending {
		if p.step == pipeDone {
			continue
		}
		total++
		i := 0
		for i < len(byServer) && byServer[i].server != p.server {
			i++
		}
		if i == len(byServer) {
			if i < cap(byServer) {
				byServer = byServer[:i+1]
				byServer[i].server, byServer[i].ops = p.server, byServer[i].ops[:0]
			} else {
				byServer = append(byServer, serverOps{server: p.server, ops: make([]*pipeOp, 0, len(pending))})
			}
		}
		byServer[i].ops = append(byServer[i].ops, p)
	}
	sc.byServer = byServer
	if len(byServer) == 0 {
		return
	}
	w.rounds.Add(1)
	if cap(sc.cmds) < total {
		sc.cmds = make([]metaCmd, total)
		sc.replies = make([]metaReply, total)
	}
	cmds, replies := sc.cmds[:total], sc.replies[:total]
	exchanges := sc.exchanges[:0]
	for _, so := range byServer {
		n := len(so.ops)
		conns := max(1, min(w.cfg.ConnsPerServer, n/w.cfg.MinCommandsPerConn))
		per := (n + conns - 1) / conns
		for start := 0; start < n; start += per {
			end := min(start+per, n)
			k := end - start
			exchanges = append(exchanges, pipeExchange{server: so.server, ops: so.ops[start:end],
				cmds: cmds[:k:k], replies: replies[:k:k]})
			cmds, replies = cmds[k:], replies[k:]
		}
	}
	sc.exchanges = exchanges
	var wg sync.WaitGroup
	for i := range exchanges {
		if i == len(exchanges)-1 {
			w.exchange(ctx, &exchanges[i])
		} else {
			wg.Go(func() { w.exchange(ctx, &exchanges[i]) })
		}
	}
	wg.Wait()
	for i := range exchanges {
		x := &exchanges[i]
		for j, p := range x.ops {
			w.advance(p, &x.cmds[j], &x.replies[j])
		}
	}
}

// exchange runs one connection's share of a round.
func (w *PipelineWriter) exchange(ctx context.Context, x *pipeExchange) {
	clear(x.replies)
	for j, p := range x.ops {
		w.command(p, &x.cmds[j])
		p.sends++
	}
	conn, dialed, err := w.pool.acquire(ctx, x.server)
	if dialed {
		w.dials.Add(1)
	}
	if err != nil {
		// Nothing was sent.
		for j := range x.replies {
			x.replies[j] = metaReply{status: metaFailed, err: err}
		}
		return
	}
	start := time.Now()
	sent, err := conn.exchange(ctx, x.cmds, x.replies, w.cfg.Timeout)
	w.cfg.ObserveRoundTrip.Since(start)
	w.pool.release(x.server, conn, err != nil)
	w.roundTrips.Add(1)
	w.commands.Add(uint64(sent))
	if err != nil {
		w.brokenConns.Add(1)
		w.log.Debug("memcached exchange failed; connection closed",
			"server", x.server.addr.String(), "commands", sent, "err", err)
	}
}

// command fills cmd with the command of p's step.
func (w *PipelineWriter) command(p *pipeOp, cmd *metaCmd) {
	op := p.op
	*cmd = metaCmd{key: op.Key}
	switch p.step {
	case stepBump:
		cmd.verb, cmd.quiet, cmd.delta = metaArith, p.quiet, 1
		cmd.vivify, cmd.initial, cmd.ttl = true, p.initial, w.exptime(op.Rule.TTL)
		// Loud, an increment answers HD like a creation; the value tells
		// them apart.
		cmd.returnValue = !p.quiet
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		// memcached keeps an item's TTL on append.
		cmd.verb, cmd.mode, cmd.quiet, cmd.data = metaSet, metaModeAppend, p.quiet, p.tokens
	case stepInspect, stepSampleGet:
		cmd.verb = metaGet
	case stepCompactCAS, stepSampleCAS:
		// memcached cannot keep the remaining TTL through a rewrite: the
		// compacted set gets the rule's TTL.
		cmd.verb, cmd.data, cmd.cas = metaSet, p.data, p.cas
		w.setTTL(cmd, op.Rule.TTL)
	case stepLoadAdd, stepCounterAdd:
		cmd.verb, cmd.mode, cmd.data = metaSet, metaModeAdd, p.data
		w.setTTL(cmd, op.Rule.TTL)
	case stepCounterSet:
		cmd.verb, cmd.data = metaSet, p.data
		w.setTTL(cmd, op.Rule.TTL)
	case stepDelta:
		cmd.verb, cmd.mode = metaArith, metaModeIncr
		if op.Delta < 0 {
			// The value shows whether memcached clamped it at zero. For
			// math.MinInt64, uint64(-Delta) is 1<<63, its magnitude.
			cmd.mode, cmd.delta, cmd.returnValue = metaModeDecr, uint64(-op.Delta), true
		} else {
			cmd.delta = uint64(op.Delta)
		}
	case stepDelete:
		cmd.verb = metaDelete
	}
}

func (w *PipelineWriter) setTTL(cmd *metaCmd, ttl time.Duration) {
	if e := w.exptime(ttl); e > 0 {
		cmd.ttl, cmd.hasTTL = e, true
	}
}

// exptime converts a rule TTL with Expiration.
func (w *PipelineWriter) exptime(ttl time.Duration) int64 {
	return int64(Expiration(ttl, w.cfg.Now()))
}

// pipeVerb names p's step as the Writer names its requests, for errors.
func pipeVerb(p *pipeOp) string {
	switch p.step {
	case stepBump:
		return "incr"
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		return "append"
	case stepInspect, stepSampleGet:
		return "gets"
	case stepCompactCAS, stepSampleCAS:
		return "cas"
	case stepLoadAdd, stepCounterAdd:
		return "add"
	case stepCounterSet:
		return "set"
	case stepDelta:
		return deltaVerbOf(p.op.Delta)
	case stepDelete:
		return "delete after failed " + p.deleteWhy
	}
	return p.op.Kind.String()
}

func deltaVerbOf(delta int64) string {
	if delta < 0 {
		return "decr"
	}
	return "incr"
}

// advance moves p on by the reply to its command.
func (w *PipelineWriter) advance(p *pipeOp, cmd *metaCmd, rep *metaReply) {
	op := p.op
	if p.step == stepDelta && (rep.status == metaHD || rep.status == metaVA || rep.unknown) {
		// Applied, or perhaps applied.
		p.deltaApplied = true
	}
	if rep.status == metaFailed && rep.resend {
		// Quiet and perhaps failed, or failed with an error line that
		// could not be placed: send it again, loud.
		if p.sends >= pipelineMaxSends {
			w.fail(p, pipeVerb(p), rep.err)
			return
		}
		p.quiet = false
		return
	}
	failed := rep.status == metaFailed
	refused := rep.status == metaNS || (failed && errors.Is(rep.err, ErrTooLarge))
	switch p.step {
	case stepBump:
		switch {
		case rep.status == metaQuietOK:
			w.finish(p, OutcomeIncr)
		case rep.status == metaHD && cmd.quiet:
			w.finish(p, OutcomeAdded)
		case rep.status == metaHD:
			w.finish(p, OutcomeIncr)
		case rep.status == metaVA:
			if string(rep.value) == strconv.FormatUint(p.initial, 10) {
				w.finish(p, OutcomeAdded)
			} else {
				w.finish(p, OutcomeIncr)
			}
		case rep.status == metaNS:
			// The namespace could not be created after the miss; try again.
			p.attempts++
			if p.attempts >= writerBumpAttempts {
				w.fail(p, "bump", fmt.Errorf("still missing after %d attempts: %w", p.attempts, memcache.ErrCacheMiss))
			}
		case failed && metaIsClientError(rep.err):
			// Not a number: no version can be derived from it. A missing
			// namespace is correct (readers start a new version).
			w.log.Warn("namespace holds a non-numeric value; deleting it", "key", op.Key, "rule", op.Rule.Name, "err", rep.err)
			w.toDelete(p, "incr")
		default:
			w.unexpected(p, rep)
		}
	case stepAppend, stepAppendAgain, stepAppendAfterAdd:
		switch {
		case rep.status == metaQuietOK || rep.status == metaHD:
			if p.step == stepAppend {
				w.sampleCompaction(p)
			} else if p.step == stepAppendAgain {
				w.finish(p, p.outcome)
			} else {
				w.finish(p, OutcomeAppended)
			}
		case refused && p.step == stepAppend:
			// memcached answers NS both when the set is missing and when
			// the grown item would exceed its item size limit (and
			// SERVER_ERROR when the tokens alone exceed it): look at it.
			p.step, p.quiet = stepInspect, false
		case refused && p.step == stepAppendAgain:
			w.log.Warn("set cannot take the appended tokens even after compaction; deleting it",
				"key", op.Key, "rule", op.Rule.Name, "token_bytes", len(p.tokens))
			w.toDelete(p, "append")
		case refused:
			// The loaded set lost its add race and is now gone again, or
			// full: a missing set is the safe state.
			w.toDelete(p, "append")
		default:
			w.unexpected(p, rep)
		}
	case stepInspect:
		switch rep.status {
		case metaEN:
			if op.Rule.Query == "" || w.loader == nil {
				w.finish(p, OutcomeMissing)
			} else {
				p.step = stepLoad
			}
		case metaVA:
			// The set exists: compact it (whenever that shrinks it) and
			// append again. If the refusal was a miss and the set has
			// been created since, the second append simply succeeds.
			compacted := EncodeSet(DecodeSet(rep.value).Members)
			if len(compacted) < len(rep.value) {
				p.step, p.data, p.cas = stepCompactCAS, string(compacted), rep.cas
			} else {
				p.step = stepAppendAgain
			}
		default:
			w.unexpected(p, rep)
		}
	case stepCompactCAS, stepSampleCAS:
		var compacted bool
		switch rep.status {
		case metaHD:
			w.compactions.Add(1)
			compacted = true
		case metaEX, metaNF, metaNS:
			// Appended to, evicted or deleted since it was read: the newer
			// state wins.
			w.casConflicts.Add(1)
		default:
			if p.step == stepCompactCAS {
				w.unexpected(p, rep)
				return
			}
			// A failed sampled compaction does not fail the op, whose
			// append is done.
			w.log.Debug("set compaction failed", "key", op.Key, "err", rep.err)
		}
		if p.step == stepSampleCAS {
			w.finish(p, pipeOutcome(compacted))
			return
		}
		if compacted {
			p.outcome = OutcomeCompacted
		}
		p.step = stepAppendAgain
	case stepSampleGet:
		if rep.status != metaVA {
			if rep.status != metaEN {
				w.log.Debug("set compaction check failed", "key", op.Key, "err", rep.err)
			}
			w.finish(p, OutcomeAppended)
			return
		}
		st := DecodeSet(rep.value)
		if !st.Dirty(w.cfg.CompactRatio) {
			w.finish(p, OutcomeAppended)
			return
		}
		compacted := EncodeSet(st.Members)
		if len(compacted) >= len(rep.value) {
			w.finish(p, OutcomeAppended)
			return
		}
		p.step, p.data, p.cas = stepSampleCAS, string(compacted), rep.cas
	case stepLoadAdd:
		switch {
		case rep.status == metaHD:
			w.finish(p, OutcomeLoaded)
		case rep.status == metaNS:
			// Created by another writer or a reader since the miss; it may
			// have been loaded before the change committed, so append it.
			p.step = stepAppendAfterAdd
		case failed && errors.Is(rep.err, ErrTooLarge):
			w.log.Warn("loaded set exceeds memcached's item size; leaving it missing",
				"key", op.Key, "rule", op.Rule.Name, "set_bytes", len(p.data))
			w.toDelete(p, "add")
		default:
			w.unexpected(p, rep)
		}
	case stepDelta:
		switch {
		case rep.status == metaHD && op.Delta > 0:
			w.finish(p, OutcomeIncr)
		case rep.status == metaVA:
			n, err := strconv.ParseUint(string(rep.value), 10, 64)
			if err == nil && n > 0 {
				w.finish(p, OutcomeDecr)
				return
			}
			// memcached clamps a decr at zero: a counter that reached zero
			// cannot be told from one that would have gone below. Recount.
			w.drifts.Add(1)
			w.log.Debug("counter decr reached zero; recounting", "key", op.Key, "rule", op.Rule.Name, "delta", op.Delta)
			w.recountDelta(p, stepRecountSet)
		case rep.status == metaNF:
			if p.raced || op.Rule.Query == "" || (w.recounter == nil && !w.cfg.RecountElsewhere) {
				// No recount query: the counter stays missing. Raced: added
				// by someone else after our miss, then evicted or deleted
				// before the delta got there; missing is correct.
				w.finish(p, OutcomeMissing)
				return
			}
			w.recountDelta(p, stepRecountAdd)
		case failed && metaIsClientError(rep.err):
			// The item is not a decimal number, so not a counter value to
			// trust.
			w.drifts.Add(1)
			w.log.Warn("counter holds a non-numeric value; recounting", "key", op.Key, "rule", op.Rule.Name, "err", rep.err)
			w.recountDelta(p, stepRecountSet)
		default:
			w.unexpected(p, rep)
		}
	case stepCounterAdd:
		switch rep.status {
		case metaHD:
			w.finish(p, OutcomeLoaded)
		case metaNS:
			// Created since our miss by another writer or a reader (MySQL
			// committed the change before it was published, so the recount
			// included it, but theirs may not have): apply the delta to it.
			w.log.Debug("counter add lost a race; applying the delta again", "key", op.Key, "rule", op.Rule.Name)
			p.step, p.raced = stepDelta, true
		default:
			w.unexpected(p, rep)
		}
	case stepCounterSet:
		if rep.status == metaHD {
			w.finish(p, OutcomeRecounted)
		} else {
			w.unexpected(p, rep)
		}
	case stepDelete:
		switch rep.status {
		case metaHD, metaNF:
			w.deletes.Add(1)
			w.finish(p, OutcomeDeleted)
		default:
			w.unexpected(p, rep)
		}
	}
	if p.step != pipeDone && p.sends >= pipelineMaxSends {
		w.fail(p, pipeVerb(p), fmt.Errorf("gave up after %d requests", p.sends))
	}
}

func pipeOutcome(compacted bool) Outcome {
	if compacted {
		return OutcomeCompacted
	}
	return OutcomeAppended
}

// sampleCompaction follows a successful first append: on a CompactSample
// share of appends the set is read and compacted when dirty.
func (w *PipelineWriter) sampleCompaction(p *pipeOp) {
	if w.cfg.CompactSample < 0 || (w.cfg.CompactSample < 1 && rand.Float64() >= w.cfg.CompactSample) {
		w.finish(p, OutcomeAppended)
		return
	}
	p.step = stepSampleGet
}

// recountDelta moves a delta whose counter must be recounted to step, or
// finishes it with OutcomeRecountNeeded when the caller recounts
// (RecountElsewhere).
func (w *PipelineWriter) recountDelta(p *pipeOp, step pipeStep) {
	if w.cfg.RecountElsewhere {
		w.finish(p, OutcomeRecountNeeded)
		return
	}
	p.step = step
}

// toDelete makes p delete its item next, because it cannot be kept
// correct; why names what could not be done.
func (w *PipelineWriter) toDelete(p *pipeOp, why string) {
	p.step, p.deleteWhy = stepDelete, why
}

// unexpected fails p with a reply its step does not handle.
func (w *PipelineWriter) unexpected(p *pipeOp, rep *metaReply) {
	w.fail(p, pipeVerb(p), metaReplyError(rep))
}

func (w *PipelineWriter) finish(p *pipeOp, outcome Outcome) {
	p.step, p.result = pipeDone, Result{Outcome: outcome}
}

// fail ends p with err; verb names the request that failed ("" when none
// was made). A counter op whose delta may be in memcached fails with
// ErrUnknownOutcome.
func (w *PipelineWriter) fail(p *pipeOp, verb string, err error) {
	op := p.op
	if verb == "" {
		verb = op.Kind.String()
	}
	if op.Kind == rules.OpCount && p.deltaApplied {
		err = fmt.Errorf("cacheops: %s %q: %w: %w", verb, op.Key, ErrUnknownOutcome, err)
	} else {
		err = fmt.Errorf("cacheops: %s %q: %w", verb, op.Key, err)
	}
	p.step, p.result = pipeDone, failedResult(err)
}

// ErrNoMetaProtocol marks a server that does not answer the meta commands
// the PipelineWriter needs (memcached older than 1.6, or a proxy that does
// not route them); memcached.protocol text serves such servers.
var ErrNoMetaProtocol = errors.New("memcached does not speak the meta protocol the pipelined writer needs; set memcached.protocol: text")

// metaProbeKey is the item the probe creates (for one second).
const metaProbeKey = "cachewarden:meta-probe"

// Probe checks that every server answers what the writer sends: an
// arithmetic command that creates a missing item (ma with N and J) and
// the no-op that ends a pipelined round (mn), with opaque tokens. It
// returns an error wrapping ErrNoMetaProtocol, naming the server and its
// answer, when a server answers otherwise; a network error as it is.
func (w *PipelineWriter) Probe(ctx context.Context) error {
	return w.pool.sel.Each(func(addr net.Addr) error {
		return w.probeServer(ctx, addr)
	})
}

func (w *PipelineWriter) probeServer(ctx context.Context, addr net.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, w.pool.timeout)
	defer cancel()
	conn, err := w.pool.dial(ctx, addr.Network(), addr.String())
	if err != nil {
		return fmt.Errorf("cacheops: probe %s: %w", addr, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	if _, err := io.WriteString(conn, "ma "+metaProbeKey+" N1 J0 D0 O7\r\nmn\r\n"); err != nil {
		return fmt.Errorf("cacheops: probe %s: %w", addr, err)
	}
	r := bufio.NewReader(conn)
	first, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("cacheops: probe %s: %w", addr, err)
	}
	first = strings.TrimRight(first, "\r\n")
	ok := (strings.HasPrefix(first, "HD ") || strings.HasPrefix(first, "VA ")) && strings.Contains(first+" ", " O7 ")
	if ok && strings.HasPrefix(first, "VA ") {
		// The value line follows.
		if _, err := r.ReadString('\n'); err != nil {
			return fmt.Errorf("cacheops: probe %s: %w", addr, err)
		}
	}
	if ok {
		second, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("cacheops: probe %s: %w", addr, err)
		}
		if strings.TrimRight(second, "\r\n") == "MN" {
			return nil
		}
		first = strings.TrimRight(second, "\r\n")
	}
	return fmt.Errorf("cacheops: probe %s: answered %q to %q: %w", addr, first, "ma "+metaProbeKey+" N1 J0 D0 O7", ErrNoMetaProtocol)
}
