package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/planout"

	"github.com/cachewarden/cachewarden/rules"
)

// Replay defaults (Config).
const (
	// DefaultParallel is how many partitions a replay reads at once.
	DefaultParallel = 4
	// DefaultMaxPendingRecounts bounds the counter and set keys a replay
	// keeps for its final recounts and set rebuilds before it runs them
	// early.
	DefaultMaxPendingRecounts = 100_000
)

// Config assembles a Replayer.
type Config struct {
	// Pipeline decodes, plans and applies (Stack.Pipeline of a stack
	// built with StackOptions{NoDLQ: true, RecountReason: "replay"});
	// required. Its PoisonSink is not used: replay reports poison
	// messages itself.
	Pipeline *pipeline.Pipeline
	// BatchSize is the most messages in one batch; default
	// pipeline.DefaultMaxEvents.
	BatchSize int
	// Parallel is how many partitions are read and applied at once;
	// default DefaultParallel. A dry run reads one at a time so
	// that its output is in a fixed order.
	Parallel int
	// MaxPendingRecounts bounds the counter and set keys collected for
	// the final recounts and set rebuilds; when that many are pending they
	// are run at once and the collection starts over (a key seen again is
	// recounted or rebuilt again). Default DefaultMaxPendingRecounts.
	MaxPendingRecounts int
	// SetAppend appends set tokens as the daemon does. By default (false)
	// a replay appends no set token: every set it touches is rebuilt from
	// its load query at the end (OpSetRebuild), or deleted when its rule
	// has none (OpSetDelete). Appending old tokens is right only when the
	// replay runs to the live end of the stream while no daemon applies
	// newer ones (CheckSetAppend): otherwise an old "+m" appended after a
	// newer "-m" makes m a member again.
	SetAppend bool
	// Report receives one line per message that could not be decoded or
	// planned (see Replayer); nil discards them.
	Report io.Writer
	// Progress, when not nil, shows the replay's progress.
	Progress *Progress
	// Logger receives the replay's records; nil discards.
	Logger *slog.Logger
}

// Input is what to replay: File when not nil, else Messages when
// not nil, else Ranges.
type Input struct {
	// File holds one CDC message value per line (NDJSON), read to its
	// end.
	File io.Reader
	// FileLines is the number of lines of File when known (the progress
	// total); 0 when not.
	FileLines int64
	// Decoder decodes File's lines; nil means the pipeline's default
	// decoder (the config's kafka.format).
	Decoder *decode.Decoder
	// Streams are the ordered parts of the input read in parallel (Kafka
	// partition ranges: kafka.RangeStreams).
	Streams []Stream
	// Messages are messages already read (the originals of dead letters,
	// `cachewarden dlq redrive`), each planned and applied as a batch of
	// its own, in order; their Pos names their topic, whose decoder
	// applies.
	Messages []pipeline.Message
	// Outcome, when not nil, receives what became of Messages[i] once it
	// was applied (not in a dry run).
	Outcome func(i int, o MessageOutcome)
}

// MessageOutcome is what became of one message of Input.Messages.
type MessageOutcome struct {
	// Poison is why the message, or one of its row changes, could not be
	// decoded or planned again; nil when it was.
	Poison error
	// Ops counts its ops applied or given up on; Failed those given up
	// on; EndOps its counter and set keys left to the recounts and set
	// rebuilds that run when the replay ends.
	Ops, Failed, EndOps int
}

// Summary counts what a replay did.
type Summary struct {
	// Messages is the number of messages (Kafka records or input lines)
	// read.
	Messages int64
	// Events counts the row changes decoded; Skipped the messages without
	// one (tombstones, DDL, heartbeats...).
	Events, Skipped int64
	// Poison counts messages that could not be decoded or of which a row
	// change could not be planned; each was reported.
	Poison int64
	// Ops counts the bump ops (and with SetAppend the set ops) after
	// coalescing that were applied or given up on (in a dry run: every
	// planned op printed).
	Ops int64
	// Recounts counts the counter keys recounted.
	Recounts int64
	// SetRebuilds counts the set keys rebuilt or deleted at the end
	// (none with Config.SetAppend).
	SetRebuilds int64
	// PendingRecounts counts counter and set keys whose recount or
	// rebuild was not run because the replay stopped early.
	PendingRecounts int64
	// Failed counts ops given up on after a permanent error (logged).
	Failed int64
	// Duration is the time the replay took.
	Duration time.Duration
}

// Failures returns the number of things that went wrong: poison messages
// and failed ops.
func (s Summary) Failures() int64 { return s.Poison + s.Failed }

// String renders the summary as one line.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d messages in %s", s.Messages, s.Duration.Round(time.Millisecond))
	if secs := s.Duration.Seconds(); secs > 0 {
		b.WriteString(" (")
		b.Write(appendRate(nil, float64(s.Messages)/secs))
		b.WriteString(" msg/s)")
	}
	fmt.Fprintf(&b, ": %d events, %d skipped, %d poison; %d ops, %d recounts, %d set rebuilds, %d failed",
		s.Events, s.Skipped, s.Poison, s.Ops, s.Recounts, s.SetRebuilds, s.Failed)
	if s.PendingRecounts > 0 {
		fmt.Fprintf(&b, "; %d recounts and set rebuilds not run", s.PendingRecounts)
	}
	return b.String()
}

// Replayer re-reads a range of CDC messages and applies them
// (docs/operations.md): bumps as the daemon applies them, while every
// counter a change touches is recounted, and every set it touches rebuilt
// from its load query (or deleted when its rule has none), once per key at
// the end of the replay rather than once per batch: the deltas and tokens
// were applied when the messages were first consumed, MySQL already holds
// their result, and old set tokens appended again could make a removed
// member a member again. Config.SetAppend appends set tokens
// instead.
//
// Input is an NDJSON file (Input.File), read in batches in order,
// or Kafka partition ranges, read directly by partition (no consumer
// group, nothing committed), up to Config.Parallel partitions at
// once, each in order.
//
// Poison messages are reported to Config.Report, one line each, and
// counted; they are not sent to the DLQ (the daemon did that when it first
// met them). A file line is reported as "line N: reason", a Kafka record
// as "topic:partition:offset: reason". The ops of a poison message's
// other row changes are applied, as the daemon does.
//
// A Replayer may run several replays one after the other, not at once.
type Replayer struct {
	cfg      Config
	p        *pipeline.Pipeline
	log      *slog.Logger
	progress *Progress

	reportMu sync.Mutex
	// pending and sum are fresh for each replay.
	pending *pendingEndOps
	sum     *replayCounts
}

// replayCounts are the summary's counts, updated by concurrent workers.
type replayCounts struct {
	messages, events, skipped, poison, ops, recounts, setRebuilds, failed atomic.Int64
}

// New checks cfg and returns a Replayer.
func New(cfg Config) (*Replayer, error) {
	if cfg.Pipeline == nil {
		return nil, errors.New("replay: a Pipeline is required")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = pipeline.DefaultMaxEvents
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.MaxPendingRecounts <= 0 {
		cfg.MaxPendingRecounts = DefaultMaxPendingRecounts
	}
	if cfg.Report == nil {
		cfg.Report = io.Discard
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Replayer{cfg: cfg, p: cfg.Pipeline, log: log, progress: cfg.Progress}, nil
}

// Replay replays in and returns what it did. It returns an error when the
// input cannot be read to its end or ctx ends (the summary then says how
// far it got); poison messages and failed ops are only counted. Transient
// memcached and MySQL errors are retried as in the daemon, for as long as
// it takes. Pending delayed second bumps (rebump_after) are applied when
// the replay ends.
func (rp *Replayer) Replay(ctx context.Context, in Input) (Summary, error) {
	return rp.run(ctx, in, nil)
}

// DryRun plans in without applying anything and writes the ops to out in
// the `cachewarden plan` format (docs/operations.md), counter deltas and
// set tokens as planned, followed by what Replay would run at the end:
// one line without a "line" field per key, in key order, "recount" for a
// counter, "set_rebuild" or "set_delete" for a set (none with SetAppend).
// For a file the lines before those are exactly the output of `cachewarden
// plan` with the same decoder, error reports included. For Kafka input
// "line" is the message's 1-based ordinal in the replay, partitions taken
// one after the other in the order of in.Ranges; error reports read
// "line N: topic:partition:offset: reason".
func (rp *Replayer) DryRun(ctx context.Context, in Input, out io.Writer) (Summary, error) {
	if out == nil {
		return Summary{}, errors.New("replay: dry run without output")
	}
	return rp.run(ctx, in, out)
}

func (rp *Replayer) run(ctx context.Context, in Input, planOut io.Writer) (Summary, error) {
	start := time.Now()
	rp.sum = &replayCounts{}
	rp.pending = &pendingEndOps{}
	dry := planOut != nil

	total := in.FileLines
	if in.File == nil && in.Messages != nil {
		total = int64(len(in.Messages))
	} else if in.File == nil {
		total = 0
		for _, st := range in.Streams {
			total += st.Len()
		}
	}
	rp.progress.begin(total)

	var stopRebump func()
	if rb := rp.p.Rebumper(); rb != nil && !dry {
		bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			rb.Run(bg)
		}()
		stopRebump = func() {
			cancel()
			<-done
			flushCtx, cancelFlush := context.WithTimeout(context.WithoutCancel(ctx), pipeline.DefaultFlushTimeout)
			rb.Flush(flushCtx)
			cancelFlush()
		}
	}

	var err error
	switch {
	case dry:
		err = rp.dryRun(ctx, in, planOut)
	case in.File != nil:
		err = rp.replayFile(ctx, in)
	case in.Messages != nil:
		err = rp.replayMessages(ctx, in)
	default:
		err = rp.replayStreams(ctx, in.Streams)
	}
	if err == nil && !dry {
		err = rp.flushRecounts(ctx)
	}
	rp.progress.end()
	if stopRebump != nil {
		stopRebump()
	}
	s := Summary{
		Messages:        rp.sum.messages.Load(),
		Events:          rp.sum.events.Load(),
		Skipped:         rp.sum.skipped.Load(),
		Poison:          rp.sum.poison.Load(),
		Ops:             rp.sum.ops.Load(),
		Recounts:        rp.sum.recounts.Load(),
		SetRebuilds:     rp.sum.setRebuilds.Load(),
		PendingRecounts: int64(rp.pending.len()),
		Failed:          rp.sum.failed.Load(),
		Duration:        time.Since(start),
	}
	rp.log.Debug("replay finished", "messages", s.Messages, "events", s.Events, "poison", s.Poison,
		"ops", s.Ops, "recounts", s.Recounts, "set_rebuilds", s.SetRebuilds, "failed", s.Failed, "duration", s.Duration)
	return s, err
}

// replayFile reads the file in batches and applies them one after the
// other (the order of a set's tokens spans batches).
func (rp *Replayer) replayFile(ctx context.Context, in Input) error {
	p := rp.p
	if in.Decoder != nil {
		p = p.WithDecoder(in.Decoder)
	}
	w := &replayWorker{rp: rp, p: p}
	lines := decode.NewLineReader(in.File)
	msgs := make([]pipeline.Message, 0, rp.cfg.BatchSize)
	var arena []byte
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, ok, err := lines.Next()
		if err != nil {
			return fmt.Errorf("replay: read line %d: %w", n+1, err)
		}
		if ok {
			n++
			// Earlier values stay valid when the arena grows: they keep
			// the old array.
			off := len(arena)
			arena = append(arena, line...)
			msgs = append(msgs, pipeline.Message{Value: arena[off:len(arena):len(arena)], Pos: rules.Position{Line: n}})
		}
		if len(msgs) == rp.cfg.BatchSize || (!ok && len(msgs) > 0) {
			if err := w.apply(ctx, msgs); err != nil {
				return err
			}
			rp.progress.add(int64(len(msgs)))
			clear(msgs)
			msgs, arena = msgs[:0], arena[:0]
		}
		if !ok {
			return nil
		}
	}
}

// replayStreams reads the streams, up to Parallel at once.
func (rp *Replayer) replayStreams(ctx context.Context, streams []Stream) error {
	if len(streams) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan Stream)
	var wg sync.WaitGroup
	for range min(rp.cfg.Parallel, len(streams)) {
		wg.Go(func() {
			w := &replayWorker{rp: rp, p: rp.p}
			for st := range work {
				if err := st.Read(ctx, rp.cfg.BatchSize, rp.progress.add, func(msgs []pipeline.Message) error {
					return w.apply(ctx, msgs)
				}); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for _, st := range streams {
		select {
		case work <- st:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx)
}

// dryRun plans the input sequentially with the `plan` planner.
func (rp *Replayer) dryRun(ctx context.Context, in Input, out io.Writer) error {
	pl := planout.NewWriter(rp.p.Rules(), out, rp.cfg.Report, rp.log)
	pl.ObserveOps(func(op *rules.Op) {
		if kind, ok := rp.endOpKind(op); ok {
			rp.pending.add(op, kind, math.MaxInt)
		}
	})
	var err error
	if in.File != nil {
		err = rp.dryRunFile(ctx, in, pl)
	} else if in.Messages != nil {
		err = rp.dryRunMessages(ctx, in.Messages, pl)
	} else {
		err = rp.dryRunStreams(ctx, in.Streams, pl)
	}
	if err == nil {
		for _, op := range rp.pending.take() {
			if err = pl.EndOp(&op); err != nil {
				break
			}
		}
	}
	if ferr := pl.Flush(); ferr != nil && err == nil {
		err = fmt.Errorf("replay: %w", ferr)
	}
	s := pl.Summary()
	rp.sum.messages.Store(int64(s.Lines))
	rp.sum.events.Store(int64(s.Events))
	rp.sum.skipped.Store(int64(s.Skipped))
	rp.sum.poison.Store(int64(s.Failed))
	rp.sum.ops.Store(int64(s.Ops))
	return err
}

func (rp *Replayer) dryRunFile(ctx context.Context, in Input, pl *planout.Writer) error {
	dec := in.Decoder
	if dec == nil {
		dec = rp.p.DecoderFor("")
	}
	lines := decode.NewLineReader(in.File)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, ok, err := lines.Next()
		if err != nil {
			return fmt.Errorf("replay: read line %d: %w", pl.Summary().Lines+1, err)
		}
		if !ok {
			return nil
		}
		if err := pl.Line(dec, line, ""); err != nil {
			return err
		}
		rp.progress.add(1)
	}
}

func (rp *Replayer) dryRunStreams(ctx context.Context, streams []Stream, pl *planout.Writer) error {
	var ids []uint32
	for _, st := range streams {
		err := st.Read(ctx, rp.cfg.BatchSize, rp.progress.add, func(msgs []pipeline.Message) error {
			var err error
			ids, err = rp.planLines(ctx, ids, msgs, pl)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// dryRunMessages plans msgs, in order.
func (rp *Replayer) dryRunMessages(ctx context.Context, msgs []pipeline.Message, pl *planout.Writer) error {
	var ids []uint32
	for i := range msgs {
		var err error
		if ids, err = rp.planLines(ctx, ids, msgs[i:i+1], pl); err != nil {
			return err
		}
		rp.progress.add(1)
	}
	return nil
}

// planLines plans msgs with pl, each with its topic's decoder, once the
// schemas they need are read; ids is scratch.
func (rp *Replayer) planLines(ctx context.Context, ids []uint32, msgs []pipeline.Message, pl *planout.Writer) ([]uint32, error) {
	var err error
	if ids, err = rp.p.AwaitSchemas(ctx, ids, msgs); err != nil {
		return ids, err
	}
	for i := range msgs {
		m := &msgs[i]
		if err := pl.Line(rp.p.DecoderFor(m.Pos.Topic), m.Value, coordinates(m.Pos)); err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// replayMessages applies in.Messages one at a time and tells
// in.Outcome what became of each.
func (rp *Replayer) replayMessages(ctx context.Context, in Input) error {
	w := &replayWorker{rp: rp, p: rp.p}
	for i := range in.Messages {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.apply(ctx, in.Messages[i:i+1]); err != nil {
			return err
		}
		rp.progress.add(1)
		if in.Outcome != nil {
			in.Outcome(i, w.last)
		}
	}
	return nil
}

// coordinates renders a record's topic:partition:offset.
func coordinates(pos rules.Position) string {
	return pos.Topic + ":" + strconv.Itoa(pos.Partition) + ":" + strconv.FormatInt(pos.Offset, 10)
}

// replayWorker applies batches for one goroutine.
type replayWorker struct {
	rp  *Replayer
	p   *pipeline.Pipeline
	b   pipeline.Batch
	buf []byte
	ids []uint32 // scratch of AwaitSchemas
	// last is what became of the last batch applied.
	last MessageOutcome
}

// apply plans msgs with every counter delta turned into a recount, moves
// the counter ops (and, unless SetAppend, the set ops) to the pending end
// ops, reports the poison messages and applies the rest.
func (w *replayWorker) apply(ctx context.Context, msgs []pipeline.Message) error {
	rp, p, b := w.rp, w.p, &w.b
	var err error
	if w.ids, err = p.AwaitSchemas(ctx, w.ids, msgs); err != nil {
		return err
	}
	p.Plan(b, msgs, pipeline.CoalesceOptions{Recount: true})
	rp.sum.messages.Add(int64(len(msgs)))
	rp.sum.events.Add(int64(b.Stats.Events))
	rp.sum.skipped.Add(int64(b.Stats.Skipped))
	w.last = MessageOutcome{}
	if len(b.Poison) > 0 {
		rp.sum.poison.Add(int64(len(b.Poison)))
		w.last.Poison = b.Poison[0].Err
		for i := range b.Poison {
			pm := &b.Poison[i]
			p.CountPoison(pm.Message.Pos)
			w.report(pm)
		}
		// Reported here instead of by Apply, and not sent anywhere.
		clear(b.Poison)
		b.Poison = b.Poison[:0]
	}

	kept := b.Ops[:0]
	var full bool
	for i := range b.Ops {
		op := &b.Ops[i]
		if kind, ok := rp.endOpKind(op); ok {
			full = rp.pending.add(op, kind, rp.cfg.MaxPendingRecounts) || full
			w.last.EndOps++
			continue
		}
		kept = append(kept, *op)
	}
	clear(b.Ops[len(kept):])
	b.Ops = kept
	// Recounts are counted when they run.
	b.Stats.Coalesce.DeltasToRecounts = 0

	if err := p.Apply(ctx, b); err != nil {
		return err
	}
	rp.sum.ops.Add(int64(len(b.Ops)))
	w.last.Ops = len(b.Ops)
	if len(b.Ops) > 0 {
		w.last.Failed = b.Failed()
		rp.sum.failed.Add(int64(w.last.Failed))
	}
	if full {
		rp.log.Info("running the recounts and set rebuilds collected so far", "keys", rp.pending.len(), "max_recount_keys", rp.cfg.MaxPendingRecounts)
		return rp.flushRecounts(ctx)
	}
	return nil
}

// endOpKind returns the kind of op that a replay runs at its end, once
// per key, instead of op: a recount for a counter op; for a set op, unless
// SetAppend, a rebuild when the rule has a load query and a delete when
// not. ok is false for ops applied as planned.
func (rp *Replayer) endOpKind(op *rules.Op) (kind rules.OpKind, ok bool) {
	switch op.Kind {
	case rules.OpCount, rules.OpRecount:
		return rules.OpRecount, true
	case rules.OpSetAdd, rules.OpSetRemove, rules.OpSetAppend:
		if rp.cfg.SetAppend {
			return 0, false
		}
		if op.Rule != nil && op.Rule.Query != "" {
			return rules.OpSetRebuild, true
		}
		return rules.OpSetDelete, true
	}
	return 0, false
}

// report writes one poison message's line.
func (w *replayWorker) report(pm *pipeline.Poison) {
	pos := pm.Message.Pos
	w.buf = w.buf[:0]
	switch {
	case pos.Topic != "":
		w.buf = append(w.buf, coordinates(pos)...)
	case pos.BinlogFile != "" && pos.Line == 0:
		w.buf = append(w.buf, "file:"+pos.BinlogFile+":"...)
		w.buf = strconv.AppendInt(w.buf, pos.BinlogPos, 10)
	default:
		w.buf = append(w.buf, "line "...)
		w.buf = strconv.AppendInt(w.buf, int64(pos.Line), 10)
	}
	w.buf = append(w.buf, ": "...)
	w.buf = append(w.buf, pm.Err.Error()...)
	w.buf = append(w.buf, '\n')
	w.rp.reportMu.Lock()
	defer w.rp.reportMu.Unlock()
	if _, err := w.rp.cfg.Report.Write(w.buf); err != nil {
		w.rp.log.Warn("cannot write a poison report", "error", err.Error())
	}
}

// flushRecounts runs the pending end ops (recounts and set rebuilds),
// BatchSize keys at a time, in key order.
func (rp *Replayer) flushRecounts(ctx context.Context) error {
	ops := rp.pending.take()
	if len(ops) == 0 {
		return nil
	}
	rp.log.Debug("running recounts and set rebuilds", "keys", len(ops))
	rp.progress.setNote("recounting or rebuilding " + strconv.Itoa(len(ops)) + " keys")
	defer rp.progress.setNote("")
	var counters, sets pipeline.Batch
	for chunk := range slices.Chunk(ops, rp.cfg.BatchSize) {
		counters.Ops, sets.Ops = counters.Ops[:0], sets.Ops[:0]
		for _, op := range chunk {
			if op.Kind == rules.OpRecount {
				counters.Ops = append(counters.Ops, op)
			} else {
				sets.Ops = append(sets.Ops, op)
			}
		}
		for _, run := range []struct {
			p *pipeline.Pipeline
			b *pipeline.Batch
			n *atomic.Int64
		}{{rp.p, &counters, &rp.sum.recounts}, {rp.p, &sets, &rp.sum.setRebuilds}} {
			if len(run.b.Ops) == 0 {
				continue
			}
			if err := run.p.ApplyOps(ctx, run.b); err != nil {
				// Put back what did not run, so the summary can say so.
				rp.pending.putBack(ops)
				return err
			}
			run.n.Add(int64(len(run.b.Ops)))
			rp.sum.failed.Add(int64(run.b.Failed()))
		}
		if n := len(counters.Ops); n > 0 {
			rp.p.CountRecounts(n)
		}
		ops = ops[len(chunk):]
	}
	return nil
}

// pendingEndOps collects the counter and set keys of a replay, one end op
// (recount, set rebuild or set delete) per key; it is safe for concurrent
// use.
type pendingEndOps struct {
	mu  sync.Mutex
	ops map[string]rules.Op
}

// add keeps an end op of kind for op's key unless one is pending, and
// reports whether max keys are pending.
func (pr *pendingEndOps) add(op *rules.Op, kind rules.OpKind, max int) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if _, ok := pr.ops[op.Key]; !ok {
		if pr.ops == nil {
			pr.ops = make(map[string]rules.Op)
		}
		pr.ops[op.Key] = detachedEndOp(op, kind)
	}
	return len(pr.ops) >= max
}

// take removes and returns the pending recounts sorted by key.
func (pr *pendingEndOps) take() []rules.Op {
	pr.mu.Lock()
	m := pr.ops
	pr.ops = nil
	pr.mu.Unlock()
	ops := make([]rules.Op, 0, len(m))
	for _, op := range m {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b rules.Op) int { return strings.Compare(a.Key, b.Key) })
	return ops
}

// putBack returns recounts that did not run.
func (pr *pendingEndOps) putBack(ops []rules.Op) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.ops == nil {
		pr.ops = make(map[string]rules.Op, len(ops))
	}
	for _, op := range ops {
		if _, ok := pr.ops[op.Key]; !ok {
			pr.ops[op.Key] = op
		}
	}
}

func (pr *pendingEndOps) len() int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return len(pr.ops)
}

// detachedEndOp returns an op of kind for op's key that shares no memory
// with the batch it came from (whose strings may hold whole messages), so
// that a pending end op costs only its key, args and source.
func detachedEndOp(op *rules.Op, kind rules.OpKind) rules.Op {
	out := rules.Op{
		Kind: kind,
		Rule: op.Rule,
		Key:  strings.Clone(op.Key),
		Source: rules.Position{
			Topic: op.Source.Topic, Partition: op.Source.Partition, Offset: op.Source.Offset, Line: op.Source.Line,
			BinlogFile: strings.Clone(op.Source.BinlogFile), BinlogPos: op.Source.BinlogPos,
			GTID: strings.Clone(op.Source.GTID), TsMs: op.Source.TsMs,
		},
	}
	if len(op.Args) > 0 {
		out.Args = make([]rules.Value, len(op.Args))
		for i, a := range op.Args {
			out.Args[i] = rules.Value{Kind: a.Kind, Text: strings.Clone(a.Text)}
		}
	}
	return out
}

// Stream is one ordered part of a replay's input, read in batches: a
// Kafka partition range (kafka.RangeStream). The streams of one replay
// are read up to Config.Parallel at once.
type Stream interface {
	// Len is how many positions (Kafka offsets) the stream spans: the
	// progress total.
	Len() int64
	// Read hands each batch of at most max messages to handle, in order,
	// and tells progress (which may be nil) how many positions each
	// batch passed; it returns handle's first error.
	Read(ctx context.Context, max int, progress func(n int64), handle func([]pipeline.Message) error) error
}
