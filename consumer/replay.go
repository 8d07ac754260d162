package consumer

import (
	"context"
	"errors"
	"fmt"
	"github.com/cachewarden/cachewarden/consumer/cdc"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/rules"
)

// Replay defaults (ReplayConfig).
const (
	// DefaultReplayParallel is how many partitions a replay reads at once.
	DefaultReplayParallel = 4
	// DefaultMaxPendingRecounts bounds the counter keys a replay keeps
	// for its final recounts before it runs them early.
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
	// MaxPendingRecounts bounds the counter keys collected for the final
	// recounts; when that many are pending they are run at once and the
	// collection starts over (a key seen again is recounted again).
	// Default DefaultMaxPendingRecounts.
	MaxPendingRecounts int
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

// ReplayInput is what to replay: File when not nil, else Ranges.
type ReplayInput struct {
	// File holds one CDC message value per line (NDJSON), read to its
	// end.
	File io.Reader
	// FileLines is the number of lines of File when known (the progress
	// total); 0 when not.
	FileLines int64
	// Decoder decodes File's lines; nil means the pipeline's default
	// decoder (the config's kafka.format).
	Decoder *cdc.Decoder
	// Ranges are the partition ranges to read (ResolveReplayRanges).
	Ranges []PartitionRange
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
	// Ops counts the bump and set ops after coalescing that were applied
	// or given up on (in a dry run: every op printed).
	Ops int64
	// Recounts counts the counter keys recounted.
	Recounts int64
	// PendingRecounts counts counter keys whose recount was not run
	// because the replay stopped early.
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
	fmt.Fprintf(&b, ": %d events, %d skipped, %d poison; %d ops, %d recounts, %d failed", s.Events, s.Skipped, s.Poison, s.Ops, s.Recounts, s.Failed)
	if s.PendingRecounts > 0 {
		fmt.Fprintf(&b, "; %d recounts not run", s.PendingRecounts)
	}
	return b.String()
}

// Replayer re-reads a range of CDC messages and applies them (docs/operations.md, "Replay"):
// bumps and set ops as the daemon applies them, while every counter delta
// becomes a recount, run once per key at the end of the replay rather
// than once per batch: the deltas were applied when the messages were
// first consumed, and MySQL already holds their result.
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
	pending *pendingRecounts
	sum     *replayCounts
}

// replayCounts are the summary's counts, updated by concurrent workers.
type replayCounts struct {
	messages, events, skipped, poison, ops, recounts, failed atomic.Int64
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
// the `cachewarden plan` format (docs/rules.md), counter deltas as planned.
// For a file the output is exactly that of `cachewarden plan` with the
// same decoder, error reports included. For Kafka input "line" is the
// message's 1-based ordinal in the replay, partitions taken one after the
// other in the order of in.Ranges; error reports read
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
	rp.pending = &pendingRecounts{}
	dry := planOut != nil

	total := in.FileLines
	if in.File == nil {
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
		PendingRecounts: int64(rp.pending.len()),
		Failed:          rp.sum.failed.Load(),
		Duration:        time.Since(start),
	}
	rp.log.Debug("replay finished", "messages", s.Messages, "events", s.Events, "poison", s.Poison,
		"ops", s.Ops, "recounts", s.Recounts, "failed", s.Failed, "duration", s.Duration)
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
	lines := cdc.NewLineReader(in.File)
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
	pl := cdc.NewPlanWriter(rp.p.cfg.Rules, out, rp.cfg.Report, rp.log)
	var err error
	if in.File != nil {
		err = rp.dryRunFile(ctx, in, pl)
	} else {
		err = rp.dryRunKafka(ctx, in.Ranges, pl)
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

func (rp *Replayer) dryRunFile(ctx context.Context, in ReplayInput, pl *cdc.PlanWriter) error {
	dec := in.Decoder
	if dec == nil {
		dec = rp.p.cfg.Decoder
	}
	lines := cdc.NewLineReader(in.File)
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

func (rp *Replayer) dryRunKafka(ctx context.Context, ranges []PartitionRange, pl *cdc.PlanWriter) error {
	if len(ranges) > 0 && len(rp.cfg.Kafka.Brokers) == 0 {
		return errors.New("consumer: replay: no Kafka brokers")
	}
	for _, r := range ranges {
		err := rp.readPartition(ctx, r, rp.cfg.BatchSize, func(msgs []Message) error {
			for i := range msgs {
				m := &msgs[i]
				if err := pl.Line(rp.p.decoderFor(m.Pos.Topic), m.Value, kafkaCoordinates(m.Pos)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// kafkaCoordinates renders a record's topic:partition:offset.
func kafkaCoordinates(pos rules.Position) string {
	return PartitionOffset{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset}.String()
}

// withDecoder returns a copy of p that decodes every message with dec.
func (p *Pipeline) withDecoder(dec *cdc.Decoder) *Pipeline {
	cp := *p
	cp.cfg.Decoder = dec
	cp.cfg.TopicDecoders = nil
	return &cp
}

// replayWorker applies batches for one goroutine.
type replayWorker struct {
	rp  *Replayer
	p   *Pipeline
	b   Batch
	buf []byte
}

// apply plans msgs with every counter delta turned into a recount, moves
// the counter ops to the pending recounts, reports the poison messages and
// applies the rest.
func (w *replayWorker) apply(ctx context.Context, msgs []Message) error {
	rp, p, b := w.rp, w.p, &w.b
	p.Plan(b, msgs, CoalesceOptions{Recount: true})
	rp.sum.messages.Add(int64(len(msgs)))
	rp.sum.events.Add(int64(b.Stats.Events))
	rp.sum.skipped.Add(int64(b.Stats.Skipped))
	if len(b.Poison) > 0 {
		rp.sum.poison.Add(int64(len(b.Poison)))
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
	for _, op := range b.Ops {
		if isCounterOp(op.Kind) {
			full = rp.pending.add(op, rp.cfg.MaxPendingRecounts) || full
			continue
		}
		kept = append(kept, op)
	}
	clear(b.Ops[len(kept):])
	b.Ops = kept
	// Recounts are counted when they run.
	b.Stats.Coalesce.DeltasToRecounts = 0

	if err := p.Apply(ctx, b); err != nil {
		return err
	}
	rp.sum.ops.Add(int64(len(b.Ops)))
	if len(b.Ops) > 0 {
		rp.sum.failed.Add(int64(failures(b.results)))
	}
	if full {
		rp.log.Info("running the recounts collected so far", "keys", rp.pending.len(), "max_recount_keys", rp.cfg.MaxPendingRecounts)
		return rp.flushRecounts(ctx)
	}
	return nil
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

// flushRecounts runs the pending recounts, BatchSize keys at a time, in
// key order.
func (rp *Replayer) flushRecounts(ctx context.Context) error {
	ops := rp.pending.take()
	if len(ops) == 0 {
		return nil
	}
	rp.log.Debug("running recounts", "keys", len(ops))
	rp.progress.setNote("recounting " + strconv.Itoa(len(ops)) + " counter keys")
	defer rp.progress.setNote("")
	var b Batch
	for chunk := range slices.Chunk(ops, rp.cfg.BatchSize) {
		b.Ops = chunk
		if err := rp.p.applyOps(ctx, &b); err != nil {
			// Put back what did not run, so the summary can say so.
			rp.pending.putBack(ops)
			return err
		}
		rp.p.m.recounts.WithLabelValues(rp.p.cfg.RecountReason).Add(float64(len(chunk)))
		rp.sum.recounts.Add(int64(len(chunk)))
		rp.sum.failed.Add(int64(failures(b.results)))
		ops = ops[len(chunk):]
	}
	return nil
}

// pendingRecounts collects the counter keys of a replay, one recount op
// per key; it is safe for concurrent use.
type pendingRecounts struct {
	mu  sync.Mutex
	ops map[string]rules.Op
}

// add keeps a recount of op's key unless one is pending, and reports
// whether max keys are pending.
func (pr *pendingRecounts) add(op rules.Op, max int) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if _, ok := pr.ops[op.Key]; !ok {
		if pr.ops == nil {
			pr.ops = make(map[string]rules.Op)
		}
		pr.ops[op.Key] = detachedRecount(op)
	}
	return len(pr.ops) >= max
}

// take removes and returns the pending recounts sorted by key.
func (pr *pendingRecounts) take() []rules.Op {
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
func (pr *pendingRecounts) putBack(ops []rules.Op) {
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

func (pr *pendingRecounts) len() int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return len(pr.ops)
}

// detachedRecount returns a recount op for op's key that shares no memory
// with the batch it came from (whose strings may hold whole messages), so
// that a pending recount costs only its key, args and source.
func detachedRecount(op rules.Op) rules.Op {
	out := rules.Op{
		Kind: rules.OpRecount,
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
// topic_tables entries apply), else the one of kafka.format. A non-empty
// format ("auto", "debezium", ...) or table ("db.table") overrides it.
func ReplayFileDecoder(k config.Kafka, topic, format, table string) (*cdc.Decoder, error) {
	name := k.Format
	if f, ok := k.TopicFormats[topic]; ok && topic != "" {
		name = f
	}
	if format != "" {
		name = format
	}
	if name == "" {
		name = config.DefaultFormat
	}
	f, err := cdc.ParseFormat(name)
	if err != nil {
		return nil, err
	}
	dec := &cdc.Decoder{Format: f, TopicTables: k.TopicTables}
	if topic != "" {
		dec.Table = k.TopicTables[topic]
	}
	if table != "" {
		dec.Table = table
	}
	return dec, nil
}
