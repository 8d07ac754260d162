package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/retry"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/rules"
)

// Message is one CDC message to process: a Kafka record, or a line of an
// NDJSON file (Pos.Line set, no Kafka coordinates).
type Message struct {
	Key   []byte
	Value []byte
	// Headers are the record's headers, kept for the dead-letter copy of
	// a poison message; the pipeline reads none.
	Headers []Header
	// Time is the record's timestamp; zero when unknown.
	Time time.Time
	// Fetched is when the Kafka client handed the record to the daemon
	// (the poll that returned it); zero for messages not fetched by the
	// daemon's consumer (replay, tests).
	Fetched time.Time
	// Pos is where the message came from; it becomes the events' Source.
	Pos rules.Position
	// Failed, when not nil, makes the message poison without decoding:
	// it stands for records the client could not read (an
	// OversizedBatch), and has no key or value. A *decode.DecodeError
	// naming a table makes the pipeline cover that table.
	Failed error
	// Events, when not nil, are the message's row changes as its source
	// decoded them (a transaction of the binary log): Value is not
	// decoded, and the events count under the format label "binlog".
	Events []rules.Event
}

// sourceDecodedFormat labels the events of messages a source decoded
// itself (Message.Events) in cachewarden_events_total.
const sourceDecodedFormat = "binlog"

// Header is one header of a message (a Kafka record header).
type Header struct {
	Key   string
	Value []byte
}

// Applier applies cache ops; results[i] receives the outcome of ops[i].
// *cacheops.Applier (every kind) and *counters.Counters (counts and
// recounts, exact) are Appliers.
type Applier interface {
	Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error
}

// Poison is a message that could not be decoded, or one of whose row
// changes could not be planned.
type Poison struct {
	Message Message
	Err     error
}

// SchemaFetcher reads the schemas of registry ids into the cache the
// decoders read; an error means the registry could not be asked and the
// batch must wait (see SchemaRegistry.Fetch).
type SchemaFetcher interface {
	Fetch(ctx context.Context, ids []uint32) error
}

// PoisonSink receives poison messages before the batch holding them is
// committed. *DLQ is one.
type PoisonSink interface {
	Send(ctx context.Context, poison []Poison) error
}

// Batch defaults of the sources: a batch holds at most DefaultMaxEvents
// messages and stays open at most DefaultMaxWait after its first message
// (the config's batch section).
const (
	DefaultMaxEvents = 2000
	DefaultMaxWait   = 5 * time.Millisecond
)

// Retry backoff defaults (Config.RetryMin, RetryMax).
const (
	DefaultRetryMin = 50 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
)

// Config assembles a Pipeline.
type Config struct {
	// Rules plans events into ops; required.
	Rules *rules.RuleSet
	// Decoder decodes messages of topics without an entry in
	// TopicDecoders; nil means a zero decode.Decoder (format auto).
	Decoder *decode.Decoder
	// TopicDecoders fixes the decoder per topic; may be nil.
	TopicDecoders map[string]*decode.Decoder
	// Schemas reads the schemas of Avro messages into the cache of the
	// decoders (their Schemas) before a batch is decoded (a
	// *SchemaRegistry); nil when no registry is configured.
	Schemas SchemaFetcher
	// Writer applies bumps and set ops (a *cacheops.Applier); required.
	Writer Applier
	// Counters applies count and recount ops (a *counters.Counters); nil
	// means Writer applies them too (for a writer that handles every
	// kind).
	Counters Applier
	// DeltasToWriter sends counter deltas (OpCount) to Writer even with
	// Counters set, and only recounts to Counters: Writer must answer
	// cacheops.OutcomeRecountNeeded for the deltas whose counters must be
	// recounted (a *cacheops.Applier with RecountElsewhere), which
	// the pipeline then recounts with Counters. Deltas then take the
	// Writer's path and recounts stay fenced.
	DeltasToWriter bool
	// Poison receives poison messages (a *DLQ); nil means they are only
	// logged and counted.
	Poison PoisonSink
	// Rebump schedules the delayed second bump of rules with
	// rebump_after; nil means rebump_after is ignored.
	Rebump *Rebumper
	// Metrics records what the pipeline does; nil means unregistered
	// metrics of its own.
	Metrics *Metrics
	// Logger receives poison, failure and retry records; nil discards.
	Logger *slog.Logger
	// RetryMin and RetryMax bound the exponential backoff between apply
	// attempts after transient errors; defaults 50ms and 5s.
	RetryMin, RetryMax time.Duration
	// RecountReason labels recounts that CoalesceOptions.Recount creates
	// in cachewarden_recounts_total; default "reassigned".
	RecountReason string
	// UnorderedSets is what happens to the set changes of a rule whose
	// changes may arrive out of order on a topic (see orderGuard):
	// UnorderedSetsDelete (default) or UnorderedSetsAppend.
	UnorderedSets string
	// Fences filters counter deltas against the fences of their counters'
	// recounts before coalescing, and rechecks them after applying (a
	// *counters.Counters; see fence.go). nil: deltas are applied whatever
	// their binary log position.
	Fences DeltaFencer
	// Observer samples applied ops for the consistency observer (an
	// *observer.Observer); nil observes nothing.
	Observer ChangeObserver
	// Generations reads the generations that counters live under
	// (docs/formats.md, "Generations"); nil leaves counter keys as
	// planned (tests of other parts only).
	Generations GenerationReader
	// Positions writes the position item of each source server a batch's
	// row changes come from before the batch's ops are sent
	// (docs/formats.md, "Source positions"); nil writes none.
	Positions PositionWriter
}

// Pipeline turns batches of CDC messages into applied cache ops: decode,
// plan, coalesce, apply (README, "How it works"). The daemon runs one per process and
// shares it between partitions; replay uses it the same way. It is safe
// for concurrent use; each goroutine brings its own Batch.
type Pipeline struct {
	cfg   Config
	log   *slog.Logger
	m     *Metrics
	order *orderGuard
	// schemaWaits counts the batches waiting for the schema registry;
	// copies of the pipeline (replay's) share it.
	schemaWaits *atomic.Int64
	// rules are the rules new batches are planned with (SetRules);
	// copies of the pipeline share them.
	rules *atomic.Pointer[ruleState]
	// fileDecoder, when not nil, decodes every message whatever its
	// topic (withDecoder: a replay file).
	fileDecoder *decode.Decoder
}

// ruleState is a rule set and the decoders that keep the columns its
// rules read. A batch is planned and applied with one ruleState
// (Batch.rules); SetRules replaces it for the batches planned after.
type ruleState struct {
	rules         *rules.RuleSet
	decoder       *decode.Decoder
	topicDecoders map[string]*decode.Decoder
}

// SetRules makes rs, with the decoders dec (nil: a zero decode.Decoder) and
// topicDecoders that keep the columns its rules read, the rules of the
// batches planned from now on. A batch being planned or applied finishes
// with the rules it started with. It is safe for concurrent use.
func (p *Pipeline) SetRules(rs *rules.RuleSet, dec *decode.Decoder, topicDecoders map[string]*decode.Decoder) error {
	if rs == nil {
		return errors.New("pipeline: pipeline: no rules")
	}
	if dec == nil {
		dec = &decode.Decoder{}
	}
	p.rules.Store(&ruleState{rules: rs, decoder: dec, topicDecoders: topicDecoders})
	return nil
}

// Config returns the configuration p was built with (its Rules are the
// first rules; Rules returns the current ones).
func (p *Pipeline) Config() Config { return p.cfg }

// Schemas returns the SchemaFetcher of the config (nil when none).
func (p *Pipeline) Schemas() SchemaFetcher { return p.cfg.Schemas }

// Rebumper returns the Rebumper of the config (nil when none): the source
// runs it beside its batches and flushes it when it stops.
func (p *Pipeline) Rebumper() *Rebumper { return p.cfg.Rebump }

// Rules returns the rules new batches are planned with.
func (p *Pipeline) Rules() *rules.RuleSet { return p.rules.Load().rules }

// batchRules returns the rules b was planned with, or the current ones
// for a batch that was not planned (replay's recounts).
func (p *Pipeline) batchRules(b *Batch) *ruleState {
	if b.rules != nil {
		return b.rules
	}
	return p.rules.Load()
}

// New checks cfg and returns a Pipeline.
func New(cfg Config) (*Pipeline, error) {
	if cfg.Rules == nil {
		return nil, errors.New("pipeline: pipeline: no rules")
	}
	if cfg.Writer == nil {
		return nil, errors.New("pipeline: pipeline: a Writer is required")
	}
	if cfg.DeltasToWriter && cfg.Counters == nil {
		return nil, errors.New("pipeline: pipeline: DeltasToWriter needs Counters to recount")
	}
	if cfg.Decoder == nil {
		cfg.Decoder = &decode.Decoder{}
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = DefaultRetryMin
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryMin)
	}
	if cfg.RecountReason == "" {
		cfg.RecountReason = "reassigned"
	}
	p := &Pipeline{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, schemaWaits: new(atomic.Int64), rules: new(atomic.Pointer[ruleState])}
	p.rules.Store(&ruleState{rules: cfg.Rules, decoder: cfg.Decoder, topicDecoders: cfg.TopicDecoders})
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.m == nil {
		p.m = NewMetrics(nil)
	}
	if cfg.UnorderedSets == "" {
		p.cfg.UnorderedSets = UnorderedSetsDelete
	}
	p.order = &orderGuard{policy: p.cfg.UnorderedSets, log: p.log, m: p.m}
	return p, nil
}

// SetPartitionCounts tells the pipeline how many partitions each topic
// has (a topic of one partition keeps every change in order). It is safe
// for concurrent use.
func (p *Pipeline) SetPartitionCounts(counts map[string]int) {
	p.order.setPartitions(counts)
	if p.cfg.Observer != nil {
		p.cfg.Observer.SetPartitionCounts(counts)
	}
}

// Metrics returns the metrics the pipeline records into.
func (p *Pipeline) Metrics() *Metrics { return p.m }

// BatchStats counts what planning one batch found.
type BatchStats struct {
	// Messages is the number of messages in the batch.
	Messages int
	// Events counts row changes decoded; Unmatched those that produced
	// no op.
	Events, Unmatched int
	// Skipped counts messages without row changes; Poison the poison
	// messages.
	Skipped, Poison int
	// Plan sums the planner's counts.
	Plan rules.PlanStats
	// Coalesce says what coalescing did; Coalesce.In is the number of
	// planned ops.
	Coalesce CoalesceStats
	// Fence says what the fence checks did (Process with
	// Config.Fences only).
	Fence counters.FenceStats
}

// Batch is one batch's plan, and the scratch memory to make it. The zero
// Batch is ready; reuse it for the next batch of the same goroutine.
type Batch struct {
	// Ops are the coalesced ops to apply.
	Ops []rules.Op
	// Poison are the batch's poison messages. The ops of their row
	// changes that could be planned are in Ops all the same: applying
	// them keeps the cache fresher, and re-applying them when the message
	// is replayed from the DLQ is safe.
	Poison []Poison
	Stats  BatchStats

	planned   []rules.Op
	decoded   decode.Decoded
	coalescer Coalescer
	results   []cacheops.Result
	events    labelCounts[eventLabels]
	outcomes  outcomeCounts
	// sourceTsMs are the source timestamps (Unix ms) of the batch's row
	// changes that carry one, for cachewarden_event_age_seconds.
	sourceTsMs []int64
	// positions are the newest source positions of the batch's row
	// changes, per source server (position.go).
	positions []serverPosition
	fence     batchFence
	// fallbackKeys is scratch for the fallback keys of a poison message.
	fallbackKeys []string
	// rebumps are the applied bumps whose rule has rebump_after.
	rebumps []rules.Op
	// schemaIDs is scratch for the schema ids the batch needs.
	schemaIDs []uint32
	// apply is applyOps's scratch.
	apply applyScratch
	// rules are the rules the batch was planned with.
	rules *ruleState
}

// Release drops what b keeps of the messages of the batch just handled
// and keeps its scratch memory. Decoded row images and poison messages
// share the memory of the fetch responses their messages came in (the
// planned ops do not: the planner copies what they keep): a Batch kept
// for the next batch, or by a partition that has gone quiet, must not
// keep those responses alive. Call it once the batch has been applied
// (or abandoned).
func (b *Batch) Release() {
	b.decoded.Release()
	clear(b.Poison)
	b.Poison = b.Poison[:0]
	if r := b.fence.recounts; r != nil {
		r.Release()
	}
}

// applyScratch is the memory applyOps reuses from batch to batch: the
// indexes of the ops still to apply, and the ops and results of each
// applier when they are split between two.
type applyScratch struct {
	pending               []int
	writerIdx, counterIdx []int
	writerOps, counterOps []rules.Op
	writerRes, counterRes []cacheops.Result
}

type eventLabels struct{ topic, format, outcome string }

// labelCounts counts occurrences of metric labels. Runs of one label
// (most events of a batch have the same) are counted aside, without a
// map access each.
type labelCounts[L comparable] struct {
	m    map[L]int
	last L
	n    int
}

func (c *labelCounts[L]) add(l L) {
	if c.n > 0 && l == c.last {
		c.n++
		return
	}
	c.flush()
	c.last, c.n = l, 1
}

func (c *labelCounts[L]) flush() {
	if c.n == 0 {
		return
	}
	if c.m == nil {
		c.m = make(map[L]int)
	}
	c.m[c.last] += c.n
	c.n = 0
}

// all returns every label counted since the last reset with its count.
func (c *labelCounts[L]) all() map[L]int {
	c.flush()
	return c.m
}

func (c *labelCounts[L]) reset() {
	clear(c.m)
	c.n = 0
}

func (p *Pipeline) decoderFor(topic string) *decode.Decoder {
	return p.decoderIn(p.rules.Load(), topic)
}

// decoderIn returns the decoder of topic's messages under st.
func (p *Pipeline) decoderIn(st *ruleState, topic string) *decode.Decoder {
	if p.fileDecoder != nil {
		return p.fileDecoder
	}
	if d, ok := st.topicDecoders[topic]; ok {
		return d
	}
	return st.decoder
}

// Plan decodes msgs, plans their row changes and coalesces the ops into
// b.Ops; poison messages go to b.Poison. Nothing is applied. msgs' values
// must stay unchanged until b is reused (poison messages keep them).
func (p *Pipeline) Plan(b *Batch, msgs []Message, opts CoalesceOptions) {
	p.planEvents(b, msgs)
	p.coalesce(b, opts)
}

// planEvents decodes msgs and plans their row changes into b.planned.
func (p *Pipeline) planEvents(b *Batch, msgs []Message) {
	b.fence.checked = false
	b.planned = b.planned[:0]
	clear(b.Poison) // drop references to old messages
	b.Poison = b.Poison[:0]
	b.Stats = BatchStats{Messages: len(msgs)}
	b.events.reset()
	b.sourceTsMs = b.sourceTsMs[:0]
	state := p.rules.Load()
	b.rules = state
	clear(b.positions)
	b.positions = b.positions[:0]
	for i := range msgs {
		msg := &msgs[i]
		if msg.Failed != nil {
			b.poison(msg, msg.Failed, decode.FormatAuto.String())
			p.coverPoison(b, msg, nil, msg.Failed)
			continue
		}
		events, format, ok := p.decodeMessage(b, state, msg)
		if !ok {
			continue
		}
		for j := range events {
			if ts := events[j].Source.TsMs; ts > 0 {
				b.sourceTsMs = append(b.sourceTsMs, ts)
			}
			b.includePosition(events[j].Source)
		}
		var st rules.PlanStats
		var firstErr error
		start := len(b.planned)
		b.planned, firstErr = decode.PlanMessage(state.rules, events, b.planned, &st, func(_, added int, err error) {
			b.Stats.Events++
			switch {
			case err != nil:
			case added == 0:
				b.Stats.Unmatched++
				b.events.add(eventLabels{msg.Pos.Topic, format, "unmatched"})
			default:
				b.events.add(eventLabels{msg.Pos.Topic, format, "planned"})
			}
		})
		b.Stats.Plan.Add(st)
		if msg.Pos.Topic != "" {
			p.guardOrder(b.planned[start:], msg)
		}
		if firstErr != nil {
			b.poison(msg, firstErr, format)
			p.coverPoison(b, msg, events, firstErr)
		}
	}
}

// decodeMessage returns msg's row changes and the format label they
// count under: the events its source decoded, or those its topic's
// decoder reads from its value. ok is false when msg was poison (marked
// and covered) or holds no row change (counted as skipped).
func (p *Pipeline) decodeMessage(b *Batch, state *ruleState, msg *Message) (events []rules.Event, format string, ok bool) {
	if msg.Events != nil {
		return msg.Events, sourceDecodedFormat, true
	}
	dec := p.decoderIn(state, msg.Pos.Topic)
	if err := dec.Decode(msg.Value, msg.Pos, &b.decoded); err != nil {
		b.poison(msg, err, b.decoded.Format.String())
		p.coverPoison(b, msg, nil, err)
		return nil, "", false
	}
	format = b.decoded.Format.String()
	if b.decoded.Skip != "" {
		b.Stats.Skipped++
		b.events.add(eventLabels{msg.Pos.Topic, format, "skipped"})
		return nil, "", false
	}
	return b.decoded.Events, format, true
}

// coalesce turns b.planned into b.Ops.
func (p *Pipeline) coalesce(b *Batch, opts CoalesceOptions) {
	var cs CoalesceStats
	b.Ops, cs = b.coalescer.Coalesce(b.Ops[:0], b.planned, opts)
	b.Stats.Coalesce = cs
	clear(b.planned) // the coalesced ops hold what is needed
}

func (b *Batch) poison(msg *Message, err error, format string) {
	b.Stats.Poison++
	b.Poison = append(b.Poison, Poison{Message: *msg, Err: err})
	b.events.add(eventLabels{msg.Pos.Topic, format, "poison"})
}

// Process plans msgs into b and applies the result (Plan, then Apply).
// With Config.Fences, counter deltas are checked against their
// counters' fences between planning and coalescing (fence.go); it returns
// ctx's error when ctx ends while memcached cannot be read.
func (p *Pipeline) Process(ctx context.Context, b *Batch, msgs []Message, opts CoalesceOptions) error {
	start := time.Now()
	var err error
	if b.schemaIDs, err = p.awaitSchemas(ctx, b.schemaIDs, msgs); err != nil {
		return err
	}
	p.planEvents(b, msgs)
	if err := p.stampCounters(ctx, b.planned); err != nil {
		return err
	}
	if err := p.checkFences(ctx, b, opts); err != nil {
		return err
	}
	p.coalesce(b, opts)
	err = p.Apply(ctx, b)
	if err == nil {
		now := time.Now()
		p.m.batchDuration.Observe(now.Sub(start).Seconds())
		p.observeFetchToApply(msgs, now)
	}
	return err
}

// observeFetchToApply records how long each message of a batch applied
// at now waited since it was fetched. The messages of one fetch are
// adjacent and share their fetch time: each run is one observation.
func (p *Pipeline) observeFetchToApply(msgs []Message, now time.Time) {
	eachRun(msgs, func(a, b *Message) bool { return a.Fetched.Equal(b.Fetched) }, func(m *Message, n int) {
		if !m.Fetched.IsZero() {
			p.m.fetchToApply.ObserveN(now.Sub(m.Fetched).Seconds(), n)
		}
	})
}

// eachRun calls f once for each run of adjacent elements of xs that same
// says are alike, with the run's first element and its length.
func eachRun[T any](xs []T, same func(a, b *T) bool, f func(first *T, n int)) {
	for i := 0; i < len(xs); {
		j := i + 1
		for j < len(xs) && same(&xs[i], &xs[j]) {
			j++
		}
		f(&xs[i], j-i)
		i = j
	}
}

// Apply handles a planned batch:
//
//  1. poison messages are logged once each, counted, and handed to the
//     PoisonSink (retried with backoff until it takes them);
//  2. the ops are applied, bumps and sets by the Writer and counter ops by
//     the Counters (if any) concurrently; ops that fail with an error
//     cacheops.Retryable accepts are retried, alone, with capped
//     exponential backoff (RetryMin..RetryMax) for as long as it takes:
//     the caller (the partition) waits, nothing is skipped;
//  3. an op that fails permanently (an invalid key, a command memcached
//     refuses whatever happens) is logged with its rule and source and
//     counted as outcome "failed". When its rule file has a fallback
//     namespace, the op is replaced by a bump of its table's fallback key
//     (which invalidates every key built under it) and the batch goes
//     on; without one the op is retried like a transient failure, so
//     that no offset is committed past an invalidation that was not
//     delivered: the partition holds, and after kafka.stall_timeout the
//     daemon reports not ready.
//
// Poison messages were given fallback bumps of their tables when they
// were planned (see coverPoison). Before any op is sent, the position
// items of the batch's source servers are moved forward to the batch's
// newest source positions (Config.Positions, position.go).
//
// Apply returns nil when the batch may be committed, or ctx's error when
// ctx ends first (the batch must then not be committed). After the ops
// succeeded the delayed second bumps of the batch's bump ops are scheduled
// (Rebumper.ScheduleBatch), and recorded in memcached when the Rebumper
// keeps a journal, before Apply returns.
func (p *Pipeline) Apply(ctx context.Context, b *Batch) error {
	p.recordPlan(b)
	if len(b.Poison) > 0 {
		if err := p.handlePoison(ctx, b.Poison); err != nil {
			return err
		}
	}
	if err := p.writePositions(ctx, b); err != nil {
		return err
	}
	if len(b.Ops) > 0 {
		var observed func([]rules.Op, []cacheops.Result)
		if p.cfg.Observer != nil {
			observed = p.cfg.Observer.BeforeApply(ctx, b.Ops)
		}
		if err := p.applyOps(ctx, b); err != nil {
			return err
		}
		if err := p.recheckFences(ctx, b); err != nil {
			return err
		}
		if observed != nil {
			observed(b.Ops, b.results)
		}
	}
	p.observeEventAges(b, time.Now())
	if p.cfg.Rebump != nil {
		b.rebumps = b.rebumps[:0]
		for i := range b.Ops {
			if op := &b.Ops[i]; rebumps(op) && b.results[i].Err == nil {
				b.rebumps = append(b.rebumps, *op)
			}
		}
		err := p.cfg.Rebump.ScheduleBatch(ctx, b.rebumps)
		clear(b.rebumps)
		return err
	}
	return nil
}

// observeEventAges records how old the batch's row changes were when it
// was applied.
func (p *Pipeline) observeEventAges(b *Batch, now time.Time) {
	nowMs := now.UnixMilli()
	eachRun(b.sourceTsMs, func(a, b *int64) bool { return *a == *b }, func(ts *int64, n int) {
		p.m.eventAge.ObserveN(float64(max(nowMs-*ts, 0))/1000, n)
	})
}

// recordPlan adds a planned batch's counts to the metrics.
func (p *Pipeline) recordPlan(b *Batch) {
	for l, n := range b.events.all() {
		p.m.events.WithLabelValues(l.topic, l.format, l.outcome).Add(float64(n))
	}
	b.events.reset()
	p.m.batchMessages.Observe(float64(b.Stats.Messages))
	p.m.batchOps.Observe(float64(len(b.Ops)))
	if saved := b.Stats.Coalesce.Saved(); saved > 0 {
		p.m.coalesceSaved.Add(float64(saved))
	}
	if n := b.Stats.Coalesce.DeltasToRecounts; n > 0 {
		p.m.recounts.WithLabelValues(p.cfg.RecountReason).Add(float64(n))
	}
	if f := b.Stats.Fence; f.Recounts > 0 {
		// By why the fence could not decide: counter and fence disagree
		// ("fence"), the fence is gone while the counter names it
		// ("fence_missing"), the delta comes from another server's log
		// ("other_server").
		for reason, n := range map[string]int{"fence": f.Recounts - f.FenceMissing - f.OtherServer, "fence_missing": f.FenceMissing, "other_server": f.OtherServer} {
			if n > 0 {
				p.m.recounts.WithLabelValues(reason).Add(float64(n))
			}
		}
	}
	if n := b.Stats.Fence.Skipped; n > 0 {
		p.m.ops.WithLabelValues(rules.OpCount.String(), "fenced").Add(float64(n))
	}
	planned := -b.Stats.Coalesce.DeltasToRecounts - b.Stats.Fence.Recounts
	for i := range b.Ops {
		if b.Ops[i].Kind == rules.OpRecount {
			planned++
		}
	}
	if planned > 0 {
		p.m.recounts.WithLabelValues("planned").Add(float64(planned))
	}
}

func (p *Pipeline) handlePoison(ctx context.Context, poison []Poison) error {
	for i := range poison {
		msg := &poison[i].Message
		p.m.poison.WithLabelValues(msg.Pos.Topic).Inc()
		p.log.Warn("poison message", positionAttrs(msg.Pos, "error", poison[i].Err.Error(),
			"to_dlq", p.cfg.Poison != nil)...)
	}
	if p.cfg.Poison == nil {
		return nil
	}
	for attempt := 0; ; attempt++ {
		err := p.cfg.Poison.Send(ctx, poison)
		if err == nil {
			for i := range poison {
				p.m.dlqMessages.WithLabelValues(poison[i].Message.Pos.Topic).Inc()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.m.dlqErrors.Inc()
		wait := p.backoff(attempt)
		if retry.Logged(attempt) {
			p.log.Error("cannot write poison messages to the DLQ; the partition waits",
				"messages", len(poison), "attempt", attempt+1, "retry_in", wait, "error", err.Error())
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// applyOps applies b.Ops until each has succeeded or failed permanently.
func (p *Pipeline) applyOps(ctx context.Context, b *Batch) error {
	n := len(b.Ops)
	pending := b.startResults()
	defer func() {
		b.apply.pending = pending[:0]
		// Drop the references to rules, keys and args.
		clear(b.apply.writerOps[:cap(b.apply.writerOps)])
		clear(b.apply.counterOps[:cap(b.apply.counterOps)])
	}()
	defer b.outcomes.flush(p.m.ops) // flush leaves the counts zero for the next batch
	permanentLogged := 0
	for attempt := 0; ; attempt++ {
		if err := p.sendRound(ctx, b, pending); err != nil {
			return err
		}
		var firstErr error
		pending, firstErr = p.sortResults(b, pending, attempt, &permanentLogged)
		if len(pending) == 0 {
			break
		}
		if firstErr == nil {
			continue // only fallback bumps replacing failed ops: apply them now
		}
		p.m.applyRetries.Inc()
		wait := p.backoff(attempt)
		if retry.Logged(attempt) {
			p.log.Warn("cache ops failed; retrying, the partition waits",
				"failed", len(pending), "of", n, "attempt", attempt+1, "retry_in", wait, "error", firstErr.Error())
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
	if permanentLogged > maxPermanentLogs {
		p.log.Error("more cache ops failed permanently in the batch", "not_logged", permanentLogged-maxPermanentLogs)
	}
	return nil
}

// startResults zeroes b's results for b.Ops and returns the indexes of
// every op, all pending (b's scratch, reused).
func (b *Batch) startResults() []int {
	n := len(b.Ops)
	if cap(b.results) < n {
		b.results = make([]cacheops.Result, n)
	}
	b.results = b.results[:n]
	clear(b.results)
	pending := b.apply.pending[:0]
	for i := range n {
		pending = append(pending, i)
	}
	return pending
}

// sendRound applies the pending ops of b once. Its error ends the batch
// uncommitted and is not an op failure: ctx ended (cancelled ops fail
// with its error) or the write guard refused (cacheops.WithGuard).
func (p *Pipeline) sendRound(ctx context.Context, b *Batch, pending []int) error {
	if err := cacheops.CheckGuard(ctx); err != nil {
		return err
	}
	if len(pending) == len(b.Ops) && !p.splitsOps(b.Ops) {
		// Every op, all for the Writer: no copies.
		p.timedApply(ctx, "cacheops", p.cfg.Writer, b.Ops, b.results)
	} else {
		p.applySplit(ctx, b, pending)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, i := range pending {
		if err := b.results[i].Err; errors.Is(err, cacheops.ErrWriteRefused) {
			return err
		}
	}
	return nil
}

// sortResults counts the ops of pending that are done and returns those
// to send again (in pending's memory), and the first error to retry for
// (nil when only fallback bumps replacing failed ops remain): a delta the
// Writer left for Counters (see DeltasToWriter) comes back as a recount;
// a retryable failure is sent again, a delta as a recount (a failed delta
// may still have been applied, so sending it again could count twice; a
// recount sets the value from MySQL, whatever the first attempt did); a
// permanent failure is replaced by its cover (onPermanent).
func (p *Pipeline) sortResults(b *Batch, pending []int, attempt int, permanentLogged *int) (again []int, firstErr error) {
	again = pending[:0]
	for _, i := range pending {
		res := b.results[i]
		op := &b.Ops[i]
		switch {
		case res.Err == nil && res.Outcome == cacheops.OutcomeRecountNeeded:
			op.Kind, op.Delta = rules.OpRecount, 0
		case res.Err == nil:
			b.outcomes.add(op.Kind, res.Outcome)
			continue
		case cacheops.Retryable(res.Err):
			if op.Kind == rules.OpCount {
				op.Kind, op.Delta = rules.OpRecount, 0
			}
			if firstErr == nil {
				firstErr = res.Err
			}
		default:
			if err := p.onPermanent(b, op, res.Err, attempt, permanentLogged); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		again = append(again, i)
	}
	return again, firstErr
}

// onPermanent handles an op that failed permanently with err: it is
// counted as failed and replaced by the bump of its table's fallback
// namespace or generation when one covers its rule (the change counts as
// lost, covered); else it stays, to be sent again, and err is returned:
// the partition holds until it succeeds. The first maxPermanentLogs
// failures of a batch are logged, and uncovered ones at the attempts
// retry.Logged picks.
func (p *Pipeline) onPermanent(b *Batch, op *rules.Op, err error, attempt int, logged *int) error {
	b.outcomes.add(op.Kind, cacheops.OutcomeFailed)
	fb, covered := fallbackFor(p.batchRules(b).rules, op)
	if *logged < maxPermanentLogs || (!covered && retry.Logged(attempt)) {
		if covered {
			p.log.Error("cache op failed permanently; bumping its table's fallback namespace (bump rules) or generation (set and count rules) instead", positionAttrs(op.Source,
				"op", op.Kind.String(), "key", op.Key, "rule", ruleName(op), "cover", fb.Key, "error", err.Error())...)
		} else {
			p.log.Error("cache op failed permanently and no fallback namespace or generation covers its rule; the partition holds until it succeeds (add fallback: to the rule file, or fix the cause)",
				positionAttrs(op.Source, "op", op.Kind.String(), "key", op.Key, "rule", ruleName(op), "attempt", attempt+1, "error", err.Error())...)
		}
	}
	*logged++
	if !covered {
		return err
	}
	p.countLost(LostOpFailed, true)
	*op = fb
	return nil
}

// retryUntil calls f until it succeeds, waiting with the pipeline's
// backoff between attempts: the partition waits, nothing is skipped.
// Each failure counts in cachewarden_apply_retries_total and is logged
// (at the attempts logAttempt picks) as msg with attrs. It returns nil,
// or ctx's error once ctx ends.
func (p *Pipeline) retryUntil(ctx context.Context, msg string, f func() error, attrs ...any) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.m.applyRetries.Inc()
		wait := p.backoff(attempt)
		if retry.Logged(attempt) {
			p.log.Warn(msg, append(slices.Clip(attrs), "attempt", attempt+1, "retry_in", wait, "error", err.Error())...)
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// splitsOps reports whether some of ops go to the Counters applier.
func (p *Pipeline) splitsOps(ops []rules.Op) bool {
	if p.cfg.Counters == nil {
		return false
	}
	for i := range ops {
		if p.toCounters(ops[i].Kind) {
			return true
		}
	}
	return false
}

// toCounters reports whether ops of kind k go to the Counters applier.
func (p *Pipeline) toCounters(k rules.OpKind) bool {
	if p.cfg.Counters == nil {
		return false
	}
	return k == rules.OpRecount || (k == rules.OpCount && !p.cfg.DeltasToWriter)
}

// applySplit applies the pending ops of b, the counter ops by the
// Counters applier (if any) beside the rest by the Writer, and stores
// their results in b.results.
func (p *Pipeline) applySplit(ctx context.Context, b *Batch, pending []int) {
	sc := &b.apply
	sc.writerIdx, sc.counterIdx = sc.writerIdx[:0], sc.counterIdx[:0]
	sc.writerOps, sc.counterOps = sc.writerOps[:0], sc.counterOps[:0]
	for _, i := range pending {
		if p.toCounters(b.Ops[i].Kind) {
			sc.counterIdx = append(sc.counterIdx, i)
			sc.counterOps = append(sc.counterOps, b.Ops[i])
		} else {
			sc.writerIdx = append(sc.writerIdx, i)
			sc.writerOps = append(sc.writerOps, b.Ops[i])
		}
	}
	sc.writerRes = resize(sc.writerRes, len(sc.writerOps))
	sc.counterRes = resize(sc.counterRes, len(sc.counterOps))
	var wg sync.WaitGroup
	if len(sc.counterOps) > 0 {
		wg.Go(func() { p.timedApply(ctx, "counters", p.cfg.Counters, sc.counterOps, sc.counterRes) })
	}
	if len(sc.writerOps) > 0 {
		p.timedApply(ctx, "cacheops", p.cfg.Writer, sc.writerOps, sc.writerRes)
	}
	wg.Wait()
	for j, i := range sc.writerIdx {
		b.results[i] = sc.writerRes[j]
	}
	for j, i := range sc.counterIdx {
		b.results[i] = sc.counterRes[j]
	}
}

// maxPermanentLogs bounds the per-op failure records of one batch.
const maxPermanentLogs = 10

func (p *Pipeline) timedApply(ctx context.Context, name string, a Applier, ops []rules.Op, res []cacheops.Result) {
	start := time.Now()
	// The error joins the per-op errors that res holds already.
	_ = a.Apply(ctx, ops, res)
	p.m.applyDuration.WithLabelValues(name).Observe(time.Since(start).Seconds())
}

// backoff returns the wait before retry attempt+1: RetryMin doubled per
// attempt up to RetryMax, with up to 20% jitter subtracted so partitions do
// not retry in lockstep.
func (p *Pipeline) backoff(attempt int) time.Duration {
	return retry.Backoff(attempt, p.cfg.RetryMin, p.cfg.RetryMax)
}

func resize(r []cacheops.Result, n int) []cacheops.Result {
	if cap(r) < n {
		return make([]cacheops.Result, n)
	}
	r = r[:n]
	clear(r)
	return r
}

func ruleName(op *rules.Op) string {
	if op.Rule == nil {
		return ""
	}
	return op.Rule.Name
}

// positionAttrs returns slog key-value pairs naming where a message came
// from, followed by extra.
func positionAttrs(pos rules.Position, extra ...any) []any {
	attrs := make([]any, 0, 6+len(extra))
	if pos.Topic != "" {
		attrs = append(attrs, "topic", pos.Topic, "partition", pos.Partition, "offset", pos.Offset)
	}
	if pos.Line > 0 {
		attrs = append(attrs, "line", pos.Line)
	}
	return append(attrs, extra...)
}
