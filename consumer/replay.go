package consumer

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
	"github.com/cachewarden/cachewarden/planout"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/rules"
)

// Replay defaults (ReplayConfig).
const (
	// DefaultReplayParallel is how many partitions a replay reads at once.
	DefaultReplayParallel = 4
	// DefaultMaxPendingRecounts bounds the counter and set keys a replay
	// keeps for its final recounts and set rebuilds before it runs them
	// early.
	DefaultMaxPendingRecounts = 100_000
)

// ReplayConfig assembles a Replayer.
type ReplayConfig struct {
	// Pipeline decodes, plans and applies (Stack.Pipeline of a stack
	// built with StackOptions{NoDLQ: true, RecountReason: "replay"});
	// required. Its PoisonSink is not used: replay reports poison
	// messages itself.
	Pipeline *Pipeline
	// Kafka reaches the brokers; needed for Kafka input only.
	Kafka KafkaConn
	// BatchSize is the most messages in one batch; default
	// DefaultMaxEvents.
	BatchSize int
	// Parallel is how many partitions are read and applied at once;
	// default DefaultReplayParallel. A dry run reads one at a time so
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
	// IdleTimeout is how long a partition may deliver nothing before the
	// end of its range before the replay fails; default
	// DefaultReplayIdleTimeout.
	IdleTimeout time.Duration
	// Report receives one line per message that could not be decoded or
	// planned (see Replayer); nil discards them.
	Report io.Writer
	// Progress, when not nil, shows the replay's progress.
	Progress *ReplayProgress
	// Logger receives the replay's records; nil discards.
	Logger *slog.Logger
}

// ReplayInput is what to replay: File when not nil, else Messages when
// not nil, else Ranges.
type ReplayInput struct {
	// File holds one CDC message value per line (NDJSON), read to its
	// end.
	File io.Reader
	// FileLines is the number of lines of File when known (the progress
	// total); 0 when not.
	FileLines int64
	// Decoder decodes File's lines; nil means the pipeline's default
	// decoder (the config's kafka.format).
	Decoder *decode.Decoder
	// Ranges are the partition ranges to read (ResolveReplayRanges).
	Ranges []PartitionRange
	// Messages are messages already read (the originals of dead letters,
	// `cachewarden dlq redrive`), each planned and applied as a batch of
	// its own, in order; their Pos names their topic, whose decoder
	// applies.
	Messages []Message
	// Outcome, when not nil, receives what became of Messages[i] once it
	// was applied (not in a dry run).
	Outcome func(i int, o MessageOutcome)
}

// MessageOutcome is what became of one message of ReplayInput.Messages.
type MessageOutcome struct {
	// Poison is why the message, or one of its row changes, could not be
	// decoded or planned again; nil when it was.
	Poison error
	// Ops counts its ops applied or given up on; Failed those given up
	// on; EndOps its counter and set keys left to the recounts and set
	// rebuilds that run when the replay ends.
	Ops, Failed, EndOps int
}

// ReplaySummary counts what a replay did.
type ReplaySummary struct {
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
	// (none with ReplayConfig.SetAppend).
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
func (s ReplaySummary) Failures() int64 { return s.Poison + s.Failed }

// String renders the summary as one line.
func (s ReplaySummary) String() string {
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
// member a member again. ReplayConfig.SetAppend appends set tokens
// instead.
//
// Input is an NDJSON file (ReplayInput.File), read in batches in order,
// or Kafka partition ranges, read directly by partition (no consumer
// group, nothing committed), up to ReplayConfig.Parallel partitions at
// once, each in order.
//
// Poison messages are reported to ReplayConfig.Report, one line each, and
// counted; they are not sent to the DLQ (the daemon did that when it first
// met them). A file line is reported as "line N: reason", a Kafka record
// as "topic:partition:offset: reason". The ops of a poison message's
// other row changes are applied, as the daemon does.
//
// A Replayer may run several replays one after the other, not at once.
type Replayer struct {
	cfg      ReplayConfig
	p        *Pipeline
	log      *slog.Logger
	progress *ReplayProgress

	reportMu sync.Mutex
	// pending and sum are fresh for each replay.
	pending *pendingEndOps
	sum     *replayCounts
}

// replayCounts are the summary's counts, updated by concurrent workers.
type replayCounts struct {
	messages, events, skipped, poison, ops, recounts, setRebuilds, failed atomic.Int64
}

// NewReplayer checks cfg and returns a Replayer.
func NewReplayer(cfg ReplayConfig) (*Replayer, error) {
	if cfg.Pipeline == nil {
		return nil, errors.New("consumer: replay: a Pipeline is required")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultMaxEvents
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = DefaultReplayParallel
	}
	if cfg.MaxPendingRecounts <= 0 {
		cfg.MaxPendingRecounts = DefaultMaxPendingRecounts
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultReplayIdleTimeout
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
func (rp *Replayer) Replay(ctx context.Context, in ReplayInput) (ReplaySummary, error) {
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
func (rp *Replayer) DryRun(ctx context.Context, in ReplayInput, out io.Writer) (ReplaySummary, error) {
	if out == nil {
		return ReplaySummary{}, errors.New("consumer: replay: dry run without output")
	}
	return rp.run(ctx, in, out)
}

func (rp *Replayer) run(ctx context.Context, in ReplayInput, planOut io.Writer) (ReplaySummary, error) {
	start := time.Now()
	rp.sum = &replayCounts{}
	rp.pending = &pendingEndOps{}
	dry := planOut != nil

	total := in.FileLines
	if in.File == nil && in.Messages != nil {
		total = int64(len(in.Messages))
	} else if in.File == nil {
		total = 0
		for _, r := range in.Ranges {
			total += r.Len()
		}
	}
	rp.progress.begin(total)

	var stopRebump func()
	if rb := rp.p.cfg.Rebump; rb != nil && !dry {
		bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			rb.Run(bg)
		}()
		stopRebump = func() {
			cancel()
			<-done
			flushCtx, cancelFlush := context.WithTimeout(context.WithoutCancel(ctx), DefaultShutdownTimeout)
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
		err = rp.replayKafka(ctx, in.Ranges)
	}
	if err == nil && !dry {
		err = rp.flushRecounts(ctx)
	}
	rp.progress.end()
	if stopRebump != nil {
		stopRebump()
	}
	s := ReplaySummary{
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
func (rp *Replayer) replayFile(ctx context.Context, in ReplayInput) error {
	p := rp.p
	if in.Decoder != nil {
		p = p.withDecoder(in.Decoder)
	}
	w := &replayWorker{rp: rp, p: p}
	lines := decode.NewLineReader(in.File)
	msgs := make([]Message, 0, rp.cfg.BatchSize)
	var arena []byte
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, ok, err := lines.Next()
		if err != nil {
			return fmt.Errorf("consumer: replay: read line %d: %w", n+1, err)
		}
		if ok {
			n++
			// Earlier values stay valid when the arena grows: they keep
			// the old array.
			off := len(arena)
			arena = append(arena, line...)
			msgs = append(msgs, Message{Value: arena[off:len(arena):len(arena)], Pos: rules.Position{Line: n}})
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

// replayKafka reads the ranges, up to Parallel at once.
func (rp *Replayer) replayKafka(ctx context.Context, ranges []PartitionRange) error {
	if len(ranges) == 0 {
		return nil
	}
	if len(rp.cfg.Kafka.Brokers) == 0 {
		return errors.New("consumer: replay: no Kafka brokers")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan PartitionRange)
	var wg sync.WaitGroup
	for range min(rp.cfg.Parallel, len(ranges)) {
		wg.Go(func() {
			w := &replayWorker{rp: rp, p: rp.p}
			for r := range work {
				if err := rp.readPartition(ctx, r, rp.cfg.BatchSize, func(msgs []Message) error {
					return w.apply(ctx, msgs)
				}); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for _, r := range ranges {
		select {
		case work <- r:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx)
}

// dryRun plans the input sequentially with the `plan` planner.
func (rp *Replayer) dryRun(ctx context.Context, in ReplayInput, out io.Writer) error {
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
		err = rp.dryRunKafka(ctx, in.Ranges, pl)
	}
	if err == nil {
		for _, op := range rp.pending.take() {
			if err = pl.EndOp(&op); err != nil {
				break
			}
		}
	}
	if ferr := pl.Flush(); ferr != nil && err == nil {
		err = fmt.Errorf("consumer: replay: %w", ferr)
	}
	s := pl.Summary()
	rp.sum.messages.Store(int64(s.Lines))
	rp.sum.events.Store(int64(s.Events))
	rp.sum.skipped.Store(int64(s.Skipped))
	rp.sum.poison.Store(int64(s.Failed))
	rp.sum.ops.Store(int64(s.Ops))
	return err
}

func (rp *Replayer) dryRunFile(ctx context.Context, in ReplayInput, pl *planout.Writer) error {
	dec := in.Decoder
	if dec == nil {
		dec = rp.p.rules.Load().decoder
	}
	lines := decode.NewLineReader(in.File)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, ok, err := lines.Next()
		if err != nil {
			return fmt.Errorf("consumer: replay: read line %d: %w", pl.Summary().Lines+1, err)
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

func (rp *Replayer) dryRunKafka(ctx context.Context, ranges []PartitionRange, pl *planout.Writer) error {
	if len(ranges) > 0 && len(rp.cfg.Kafka.Brokers) == 0 {
		return errors.New("consumer: replay: no Kafka brokers")
	}
	var ids []uint32
	for _, r := range ranges {
		err := rp.readPartition(ctx, r, rp.cfg.BatchSize, func(msgs []Message) error {
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
func (rp *Replayer) dryRunMessages(ctx context.Context, msgs []Message, pl *planout.Writer) error {
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
func (rp *Replayer) planLines(ctx context.Context, ids []uint32, msgs []Message, pl *planout.Writer) ([]uint32, error) {
	var err error
	if ids, err = rp.p.awaitSchemas(ctx, ids, msgs); err != nil {
		return ids, err
	}
	for i := range msgs {
		m := &msgs[i]
		if err := pl.Line(rp.p.decoderFor(m.Pos.Topic), m.Value, kafkaCoordinates(m.Pos)); err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// replayMessages applies in.Messages one at a time and tells
// in.Outcome what became of each.
func (rp *Replayer) replayMessages(ctx context.Context, in ReplayInput) error {
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

// kafkaCoordinates renders a record's topic:partition:offset.
func kafkaCoordinates(pos rules.Position) string {
	return PartitionOffset{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset}.String()
}

// withDecoder returns a copy of p that decodes every message with dec.
func (p *Pipeline) withDecoder(dec *decode.Decoder) *Pipeline {
	cp := *p
	cp.fileDecoder = dec
	return &cp
}

// replayWorker applies batches for one goroutine.
type replayWorker struct {
	rp  *Replayer
	p   *Pipeline
	b   Batch
	buf []byte
	// last is what became of the last batch applied.
	last MessageOutcome
}

// apply plans msgs with every counter delta turned into a recount, moves
// the counter ops (and, unless SetAppend, the set ops) to the pending end
// ops, reports the poison messages and applies the rest.
func (w *replayWorker) apply(ctx context.Context, msgs []Message) error {
	rp, p, b := w.rp, w.p, &w.b
	var err error
	if b.schemaIDs, err = p.awaitSchemas(ctx, b.schemaIDs, msgs); err != nil {
		return err
	}
	p.Plan(b, msgs, CoalesceOptions{Recount: true})
	rp.sum.messages.Add(int64(len(msgs)))
	rp.sum.events.Add(int64(b.Stats.Events))
	rp.sum.skipped.Add(int64(b.Stats.Skipped))
	w.last = MessageOutcome{}
	if len(b.Poison) > 0 {
		rp.sum.poison.Add(int64(len(b.Poison)))
		w.last.Poison = b.Poison[0].Err
		for i := range b.Poison {
			pm := &b.Poison[i]
			p.m.poison.WithLabelValues(pm.Message.Pos.Topic).Inc()
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
		w.last.Failed = failures(b.results)
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
func (w *replayWorker) report(pm *Poison) {
	pos := pm.Message.Pos
	w.buf = w.buf[:0]
	if pos.Topic != "" {
		w.buf = append(w.buf, kafkaCoordinates(pos)...)
	} else {
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

func failures(results []cacheops.Result) int {
	n := 0
	for i := range results {
		if results[i].Err != nil {
			n++
		}
	}
	return n
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
	var counters, sets Batch
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
			p *Pipeline
			b *Batch
			n *atomic.Int64
		}{{rp.p, &counters, &rp.sum.recounts}, {rp.p, &sets, &rp.sum.setRebuilds}} {
			if len(run.b.Ops) == 0 {
				continue
			}
			err := run.p.stampCounters(ctx, run.b.Ops)
			if err == nil {
				err = run.p.applyOps(ctx, run.b)
			}
			if err != nil {
				// Put back what did not run, so the summary can say so.
				rp.pending.putBack(ops)
				return err
			}
			run.n.Add(int64(len(run.b.Ops)))
			rp.sum.failed.Add(int64(failures(run.b.results)))
		}
		if n := len(counters.Ops); n > 0 {
			rp.p.m.recounts.WithLabelValues(rp.p.cfg.RecountReason).Add(float64(n))
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

// ReplayFileDecoder returns the decoder of an NDJSON replay file under the
// kafka section k: the one of topic when not empty (its topic_formats and
// topic_tables entries apply), else the one of kafka.format. A non-nil
// format or a non-empty table ("db.table") overrides it. A format a file
// cannot hold (avro) is refused: a file holds JSON lines.
func ReplayFileDecoder(k config.Kafka, topic string, format *decode.Format, table string) (*decode.Decoder, error) {
	f, err := replayFileFormat(k, topic, format)
	if err != nil {
		return nil, err
	}
	if !f.InFile() {
		return nil, fmt.Errorf("consumer: replay: %w, and format %s is not: "+
			"replay its topics from Kafka (--from), or give the file's JSON format with --format", decode.ErrNotInFile, f)
	}
	dec := &decode.Decoder{Format: f, TopicTables: k.TopicTables}
	if topic != "" {
		dec.Table = k.TopicTables[topic]
	}
	if table != "" {
		dec.Table = table
	}
	return dec, nil
}

// replayFileFormat returns format when not nil, else the format of topic
// under k (kafka.format when topic is "" or has no topic_formats entry).
func replayFileFormat(k config.Kafka, topic string, format *decode.Format) (decode.Format, error) {
	if format != nil {
		return *format, nil
	}
	name := k.Format
	if f, ok := k.TopicFormats[topic]; ok && topic != "" {
		name = f
	}
	if name == "" {
		name = config.DefaultFormat
	}
	return decode.ParseFormat(name)
}

// groupActive reports whether the consumer group has members: a daemon
// that consumes (or, after a SIGKILL, one whose session has not yet timed
// out). A group the brokers do not know has none. It is the one place
// replay asks the brokers about the daemon's group (CheckSetAppend).
func groupActive(ctx context.Context, conn KafkaConn, group string) (bool, error) {
	cl, err := conn.NewClient(slog.New(slog.DiscardHandler))
	if err != nil {
		return false, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return false, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	g, ok := described[group]
	switch {
	case !ok:
		return false, fmt.Errorf("describe consumer group %s: not in the brokers' answer", group)
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		return false, nil
	case g.Err != nil:
		return false, fmt.Errorf("describe consumer group %s: %w", group, g.Err)
	}
	return len(g.Members) > 0 && g.State != "Dead", nil
}

// ErrSetAppendUnsafe is the error CheckSetAppend wraps when appending old
// set tokens could leave a set wrong.
var ErrSetAppendUnsafe = errors.New("appending set tokens could leave sets wrong")

// CheckSetAppend tells whether a replay may append set tokens
// (ReplayConfig.SetAppend) rather than rebuild the sets it touches: only
// when SetAppendRange allows its range and the daemon's consumer group has
// no member, so that no newer token can land before an old one the replay
// appends. Otherwise it returns an error wrapping ErrSetAppendUnsafe that
// says which condition fails, or the error that kept it from asking the
// brokers. Run it before the replay and again after it: a daemon that
// joined meanwhile may have appended newer tokens the replay then covered.
func CheckSetAppend(ctx context.Context, conn KafkaConn, group string, to ReplayBound, file bool) error {
	if err := SetAppendRange(to, file); err != nil {
		return err
	}
	if group == "" {
		return fmt.Errorf("consumer: replay: %w: no consumer group to check (kafka.group)", ErrSetAppendUnsafe)
	}
	active, err := groupActive(ctx, conn, group)
	if err != nil {
		return fmt.Errorf("consumer: replay: cannot tell whether the daemon runs: %w", err)
	}
	if active {
		return fmt.Errorf("consumer: replay: %w: consumer group %s has active members (a daemon runs, or a killed one's session has not timed out yet); stop the daemons first", ErrSetAppendUnsafe, group)
	}
	return nil
}

// SetAppendRange reports whether a replay's range allows appending set
// tokens: Kafka input (file false) read to the live end of every
// partition (to not given). Its error wraps ErrSetAppendUnsafe.
func SetAppendRange(to ReplayBound, file bool) error {
	switch {
	case file:
		return fmt.Errorf("consumer: replay: %w: a file is not the live end of the stream", ErrSetAppendUnsafe)
	case !to.IsZero():
		return fmt.Errorf("consumer: replay: %w: the replay ends at %s, before the live end: later removals would be undone", ErrSetAppendUnsafe, to)
	}
	return nil
}
