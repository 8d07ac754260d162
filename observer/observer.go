// Package observer checks, continuously, that the cache reflects the
// changes the daemon applies: it samples a share of the applied ops and,
// a window T after each (several windows), reads the items the op touched
// through the daemon's own server selection and judges them
// (docs/operations.md, "The consistency observer"):
//
//   - a namespace version (each hot-key copy is an op of its own) must
//     have moved past the value read just before the bump; a master with
//     evidence must have the entity's bit set or a newer master version;
//   - a set must hold the members its rule's load query returns (or, for
//     a rule without one, hold or lack each member the change named, as
//     the latest change the daemon applied to that member says: watch.go);
//   - a counter must equal its recount: at a binary log position the
//     daemon has reached, when the Truth names its snapshots' positions
//     and the change carries one (position.go); else as below.
//
// A missing item is consistent. An item that cannot be judged (the truth
// moved while it was checked, the daemon did not reach a recount's
// position, a read or query failed, the budget was spent) is counted as
// not judged, never as consistent. A set, or a counter not judged at a
// position, that differs from MySQL (or, a set without a query, from the
// latest changes applied) is read again (both sides) ConfirmAfter later:
// it is inconsistent only when neither side moved meanwhile; for a set,
// only the members the first reading found wrong are compared.
//
// The results are counted in cachewarden_consistency_checks_total, logged
// with the nines every ReportEvery, and served by StatusHandler; each
// inconsistent item is logged once with its evidence.
//
// It only reads and repairs nothing; the full, one-off comparison of every
// set and counter with MySQL is package verify (`cachewarden verify`).
package observer

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Defaults of Config fields left at zero.
const (
	// DefaultSample is the share of applied ops sampled: 1%.
	DefaultSample = 0.01
	// DefaultMaxPerSecond bounds the samples of one rule per second.
	DefaultMaxPerSecond = 10
	// DefaultConfirmAfter is the delay before a mismatch with MySQL is
	// read again.
	DefaultConfirmAfter = 5 * time.Second
	// DefaultMySQLPerSecond and DefaultMemcachedPerSecond are the
	// observer's budgets: queries and item reads per second.
	DefaultMySQLPerSecond     = 50
	DefaultMemcachedPerSecond = 500
	// DefaultMaxPending bounds the sampled changes waiting for checks.
	DefaultMaxPending = 10_000
	// DefaultClockSkew is how far the clocks of the processes that create
	// namespaces may disagree.
	DefaultClockSkew = time.Second
	// DefaultReportEvery is how often the nines are logged.
	DefaultReportEvery = time.Minute
	// DefaultWorkers is how many checks run at once.
	DefaultWorkers = 4
)

// DefaultWindows are the delays after a change at which it is checked.
var DefaultWindows = []time.Duration{time.Second, 10 * time.Second, time.Minute}

// Config tunes an Observer.
type Config struct {
	// Sample is the share of applied ops observed, in (0, 1]; default
	// DefaultSample (0.01). All ops of one change event and rule are
	// sampled together (so every hot-key copy of a bump is).
	Sample float64
	// MaxPerSecond bounds the changes sampled per rule and second;
	// default DefaultMaxPerSecond (10).
	MaxPerSecond float64
	// Windows are the delays after a change is applied at which its
	// items are checked; default DefaultWindows (1s, 10s, 1m).
	Windows []time.Duration
	// ConfirmAfter is how long after a mismatch with MySQL both sides are
	// read again, and how long a counter judged at a position waits for
	// the daemon to reach the recount's position; default
	// DefaultConfirmAfter (5s).
	ConfirmAfter time.Duration
	// MySQLPerSecond and MemcachedPerSecond are the budgets of queries
	// and item reads per second; a check that finds its budget spent is
	// not judged. Defaults 50 and 500.
	MySQLPerSecond, MemcachedPerSecond float64
	// MaxPending bounds the sampled changes waiting for their checks;
	// default DefaultMaxPending (10,000). Samples beyond it are dropped
	// (cachewarden_observer_dropped_total{reason="queue_full"}).
	MaxPending int
	// ClockSkew is how far the clocks of the processes that create
	// namespaces may disagree; default DefaultClockSkew (1s).
	ClockSkew time.Duration
	// ReportEvery is how often the nines are logged; default
	// DefaultReportEvery (1m).
	ReportEvery time.Duration
	// Workers is how many checks run at once; default DefaultWorkers (4).
	Workers int
	// Detached is set for an observer of changes another process
	// applies (`cachewarden observe`): its reads "before the bump" may
	// come after it, so an unmoved version is not judged.
	Detached bool
}

func (c Config) withDefaults() Config {
	if c.Sample <= 0 {
		c.Sample = DefaultSample
	}
	c.Sample = min(c.Sample, 1)
	if c.MaxPerSecond <= 0 {
		c.MaxPerSecond = DefaultMaxPerSecond
	}
	if len(c.Windows) == 0 {
		c.Windows = DefaultWindows
	}
	if c.ConfirmAfter <= 0 {
		c.ConfirmAfter = DefaultConfirmAfter
	}
	if c.MySQLPerSecond <= 0 {
		c.MySQLPerSecond = DefaultMySQLPerSecond
	}
	if c.MemcachedPerSecond <= 0 {
		c.MemcachedPerSecond = DefaultMemcachedPerSecond
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.ClockSkew <= 0 {
		c.ClockSkew = DefaultClockSkew
	}
	if c.ReportEvery <= 0 {
		c.ReportEvery = DefaultReportEvery
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	return c
}

// Cache reads items; *memcache.Client (built on the daemon's selector)
// satisfies it.
type Cache interface {
	GetMulti(keys []string) (map[string]*memcache.Item, error)
}

// Truth runs rules' load and recount queries bound as the daemon binds
// them; *counters.MySQL satisfies it. A Truth that is also a
// counters.SnapshotCounter has counters judged at binary log positions
// (position.go).
type Truth interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
	LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error)
}

// Locator names the server of a key, for the evidence of an
// inconsistency; *itemformat.Selector satisfies it.
type Locator interface {
	PickServer(key string) (net.Addr, error)
}

// Deps are what an Observer reads through.
type Deps struct {
	// Cache is read with the daemon's own distribution; required.
	Cache Cache
	// Truth answers load and recount queries; nil leaves sets with a
	// load query and counters not judged.
	Truth Truth
	// Servers names the server of a key in evidence; may be nil.
	Servers Locator
	// Registerer receives the observer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives inconsistencies and the periodic report; nil
	// discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Member names this daemon instance in the history a report carries
	// (which instance applied each batch); "" names none.
	Member string
	// Pool names the memcached pool the observer reads in its reports;
	// "" names none.
	Pool string
}

// Observer samples applied changes and checks them later. Its methods are
// safe for concurrent use. Close stops it.
type Observer struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	m     *metrics
	stats *stats

	mcBudget, sqlBudget *bucket
	// positions are the daemon's applied binary log positions, for
	// counters judged at a position (position.go).
	positions appliedPositions
	// watch records what the daemon applied to the keys of the sampled
	// changes waiting for checks (watch.go).
	watch watchList

	mu      sync.Mutex
	queue   taskHeap
	pending int
	rate    map[*rules.Rule]*bucket
	wake    chan struct{}

	tasks  chan *task
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts an observer: a scheduler, cfg.Workers checkers and the
// periodic report, until Close.
func New(cfg Config, deps Deps) (*Observer, error) {
	if deps.Cache == nil {
		return nil, errors.New("observer: a cache to read is required")
	}
	cfg = cfg.withDefaults()
	for _, w := range cfg.Windows {
		if w <= 0 {
			return nil, fmt.Errorf("observer: window %s: must be positive", w)
		}
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	o := &Observer{
		cfg:       cfg,
		deps:      deps,
		log:       deps.Logger,
		rate:      make(map[*rules.Rule]*bucket),
		wake:      make(chan struct{}, 1),
		tasks:     make(chan *task),
		mcBudget:  newBucket(cfg.MemcachedPerSecond, deps.Now()),
		sqlBudget: newBucket(cfg.MySQLPerSecond, deps.Now()),
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	o.m = newMetrics(deps.Registerer)
	o.stats = newStats(cfg.Windows, deps.Now())
	o.ctx, o.cancel = context.WithCancel(context.Background())
	o.wg.Add(2 + cfg.Workers)
	go o.schedule()
	go o.report()
	for range cfg.Workers {
		go o.work()
	}
	return o, nil
}

// Close stops the observer; checks not yet due are dropped.
func (o *Observer) Close() {
	o.cancel()
	o.wg.Wait()
}

// Pending returns how many sampled changes wait for their last check
// (confirmations included).
func (o *Observer) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pending
}

// Config returns the observer's configuration, defaults applied.
func (o *Observer) Config() Config { return o.cfg }

// change is one sampled op and what was read before it was applied.
type change struct {
	rule   *rules.Rule
	kind   rules.OpKind
	key    string
	source rules.Position
	args   []rules.Value
	// index is the op's place in its batch.
	index int
	// before is the namespace read before the bump (bumps only).
	before   Item
	beforeAt time.Time
	// master is the evidence master read before the bump (bumps of rules
	// with evidence only).
	masterKey    string
	masterBefore Item
	bit          int
	// members are the members a set op named and whether its last token
	// adds them (escaped).
	members map[string]bool
	// logged holds the items whose inconsistency was logged (under
	// Observer.mu).
	logged map[string]bool
	// open counts the windows whose check is not done yet (under
	// Observer.mu); the change is released at zero.
	open int
}

// task is one check of a change: at a window, or the confirmation of a
// mismatch.
type task struct {
	due    time.Time
	c      *change
	window int
	// first is the first reading of a mismatch being confirmed; nil for
	// a window's first check.
	first *reading
}

// BeforeApply samples ops, a batch about to be applied, and reads what a
// check needs from before (the namespaces and masters of sampled bumps).
// It returns nil when nothing was sampled, else a function to call with
// the same ops and their results once the batch has been applied: it
// schedules the sampled ops that succeeded. Ops replaced meanwhile (a
// fallback bump instead of a failed op) are dropped.
func (o *Observer) BeforeApply(ctx context.Context, ops []rules.Op) func(ops []rules.Op, results []cacheops.Result) {
	var sampled []*change
	var applied []batchPosition
	if !o.cfg.Detached && o.deps.Truth != nil {
		applied = batchPositions(ops)
	}
	var last *rules.Op
	lastTaken := false
	now := o.deps.Now()
	for i := range ops {
		op := &ops[i]
		if !observable(op) {
			continue
		}
		same := last != nil && last.Rule == op.Rule && last.Source.Topic == op.Source.Topic &&
			last.Source.Partition == op.Source.Partition && last.Source.Offset == op.Source.Offset && last.Source.Line == op.Source.Line
		if !same {
			last = op
			lastTaken = rand.Float64() < o.cfg.Sample && o.allow(op.Rule, now)
		}
		if lastTaken {
			sampled = append(sampled, newChange(op, i))
		}
	}
	flight, watching := o.watch.begin(ops)
	if len(sampled) == 0 {
		if applied == nil && !watching {
			return nil
		}
		return func(ops []rules.Op, res []cacheops.Result) {
			o.positions.advance(applied)
			if watching {
				o.watch.record(ops, res, o.deps.Now(), o.cfg.Detached, flight)
			}
		}
	}
	o.readBefore(sampled, now)
	return func(ops []rules.Op, res []cacheops.Result) {
		o.positions.advance(applied)
		for _, c := range sampled {
			if c.kind != 0 {
				o.watch.add(c.key)
			}
		}
		o.watch.record(ops, res, o.deps.Now(), o.cfg.Detached, flight)
		o.applied(sampled, ops, res)
	}
}

// observable reports whether op's kind is checked.
func observable(op *rules.Op) bool {
	if op.Rule == nil || op.Legacy {
		return false
	}
	switch op.Kind {
	case rules.OpBump, rules.OpSetAdd, rules.OpSetRemove, rules.OpSetAppend, rules.OpCount, rules.OpRecount:
		return true
	}
	return false
}

// allow takes one sample of rule's per-second allowance.
func (o *Observer) allow(r *rules.Rule, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.rate[r]
	if b == nil {
		b = newBucket(o.cfg.MaxPerSecond, now)
		o.rate[r] = b
	}
	if b.take(1, now) {
		return true
	}
	o.m.drop(dropRateLimit)
	return false
}

func newChange(op *rules.Op, i int) *change {
	c := &change{rule: op.Rule, kind: op.Kind, key: strings.Clone(op.Key), source: clonePosition(op.Source), index: i}
	for _, a := range op.Args {
		c.args = append(c.args, rules.Value{Kind: a.Kind, Text: strings.Clone(a.Text)})
	}
	switch op.Kind {
	case rules.OpSetAdd:
		c.members = map[string]bool{strings.Clone(op.Member): true}
	case rules.OpSetRemove:
		c.members = map[string]bool{strings.Clone(op.Member): false}
	case rules.OpSetAppend:
		c.members = tokenMembers(op.Tokens)
	case rules.OpBump:
		if ev := op.Rule.Evidence; ev != nil {
			c.masterKey, c.bit = ev.MasterKey, op.EvidenceBit
		}
	}
	return c
}

// tokenMembers returns the members of joined set tokens and whether the
// last token of each adds it.
func tokenMembers(tokens string) map[string]bool {
	m := make(map[string]bool)
	for _, t := range itemformat.SetTokens([]byte(tokens)) {
		if len(t) > 1 && (t[0] == '+' || t[0] == '-') {
			m[string(t[1:])] = t[0] == '+'
		}
	}
	return m
}

func clonePosition(p rules.Position) rules.Position {
	p.Topic, p.BinlogFile, p.GTID = strings.Clone(p.Topic), strings.Clone(p.BinlogFile), strings.Clone(p.GTID)
	return p
}

// readBefore reads the namespaces and masters of the sampled bumps. A
// bump whose read fails, or that the budget does not cover, is dropped
// from the sample (it could only be not judged).
func (o *Observer) readBefore(sampled []*change, now time.Time) {
	var keys []string
	for _, c := range sampled {
		if c.kind == rules.OpBump {
			keys = append(keys, c.key)
			if c.masterKey != "" {
				keys = append(keys, c.masterKey)
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	drop := func(reason string) {
		for _, c := range sampled {
			if c.kind == rules.OpBump {
				c.kind = 0 // dropped
				o.m.drop(reason)
			}
		}
	}
	if !o.mcBudget.take(float64(len(keys)), now) {
		o.m.budgetSpent.WithLabelValues("memcached").Inc()
		drop(dropBudget)
		return
	}
	items, err := o.get(keys)
	if err != nil {
		o.log.Debug("observer: reading namespaces before their bumps failed; not sampled", "keys", len(keys), "error", err.Error())
		drop(dropReadFailed)
		return
	}
	for _, c := range sampled {
		if c.kind != rules.OpBump {
			continue
		}
		c.before, c.beforeAt = items[c.key], now
		if c.masterKey != "" {
			c.masterBefore = items[c.masterKey]
		}
	}
}

// get reads keys and counts them.
func (o *Observer) get(keys []string) (map[string]Item, error) {
	o.m.mcReads.Add(float64(len(keys)))
	got, err := o.deps.Cache.GetMulti(keys)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Item, len(keys))
	for k, it := range got {
		out[k] = Item{Present: true, Value: it.Value, cas: it.CasID}
	}
	return out, nil
}

// applied schedules the sampled changes that were applied.
func (o *Observer) applied(sampled []*change, ops []rules.Op, res []cacheops.Result) {
	now := o.deps.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range sampled {
		if c.kind == 0 {
			continue // dropped by readBefore
		}
		drop := ""
		switch {
		case c.index >= len(ops) || c.index >= len(res) || ops[c.index].Key != c.key || ops[c.index].Rule != c.rule:
			drop = dropReplaced
		case res[c.index].Err != nil:
			drop = dropNotApplied
		case o.pending >= o.cfg.MaxPending:
			drop = dropQueueFull
		}
		if drop != "" {
			o.m.drop(drop)
			o.watch.release(c.key)
			continue
		}
		o.pending++
		c.open = len(o.cfg.Windows)
		o.m.samples.WithLabelValues(c.rule.Name).Inc()
		for w, d := range o.cfg.Windows {
			heap.Push(&o.queue, &task{due: now.Add(d), c: c, window: w})
		}
	}
	o.m.pending.Set(float64(o.pending))
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// schedule hands due tasks to the workers.
func (o *Observer) schedule() {
	defer o.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.mu.Lock()
		var next *task
		var wait time.Duration
		if len(o.queue) > 0 {
			if wait = o.queue[0].due.Sub(o.deps.Now()); wait <= 0 {
				next = heap.Pop(&o.queue).(*task)
			}
		} else {
			wait = time.Hour
		}
		o.mu.Unlock()
		if next != nil {
			select {
			case o.tasks <- next:
				continue
			case <-o.ctx.Done():
				return
			}
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-o.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-o.ctx.Done():
			return
		}
	}
}

// push schedules t.
func (o *Observer) push(t *task) {
	o.mu.Lock()
	heap.Push(&o.queue, t)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// work runs due checks.
func (o *Observer) work() {
	defer o.wg.Done()
	for {
		select {
		case t := <-o.tasks:
			o.run(t)
		case <-o.ctx.Done():
			return
		}
	}
}

// done records the verdicts of t's items; the last check of a change
// (every window's, confirmations included) releases it.
func (o *Observer) done(t *task, vs []itemVerdict) {
	window := o.cfg.Windows[t.window]
	for _, v := range vs {
		o.m.checks.WithLabelValues(t.c.rule.Name, window.String(), v.result.String()).Inc()
		o.stats.add(t.c.rule.Name, t.window, v.result)
		if v.result == Inconsistent && o.firstReport(t.c, v.key) {
			o.logInconsistency(t, v.verdict, v.key)
		}
	}
	o.mu.Lock()
	t.c.open--
	last := t.c.open == 0
	if last {
		o.pending--
		o.m.pending.Set(float64(o.pending))
	}
	o.mu.Unlock()
	if last {
		o.watch.release(t.c.key)
	}
}

// firstReport reports whether key's inconsistency under c is reported
// for the first time (later windows count it without logging it again).
func (o *Observer) firstReport(c *change, key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c.logged[key] {
		return false
	}
	if c.logged == nil {
		c.logged = make(map[string]bool)
	}
	c.logged[key] = true
	return true
}

// logInconsistency logs an inconsistent item once with its evidence.
func (o *Observer) logInconsistency(t *task, v verdict, item string) {
	c := t.c
	server := ""
	if o.deps.Servers != nil {
		if addr, err := o.deps.Servers.PickServer(item); err == nil {
			server = addr.String()
		}
	}
	attrs := []any{
		"rule", c.rule.Name, "op", c.kind.String(), "window", o.cfg.Windows[t.window].String(),
		"key", item, "server", server, "pool", o.deps.Pool, "expected", v.expected, "seen", v.seen,
	}
	if c.key != item {
		attrs = append(attrs, "change_key", c.key)
	}
	s := c.source
	if s.Topic != "" {
		attrs = append(attrs, "topic", s.Topic, "partition", s.Partition, "offset", s.Offset)
	}
	if s.Line > 0 {
		attrs = append(attrs, "line", s.Line)
	}
	if s.BinlogFile != "" {
		attrs = append(attrs, "binlog_file", s.BinlogFile, "binlog_pos", s.BinlogPos)
	}
	if s.GTID != "" {
		attrs = append(attrs, "gtid", s.GTID)
	}
	if s.TsMs > 0 {
		attrs = append(attrs, "source_ts", time.UnixMilli(s.TsMs).UTC().Format(time.RFC3339Nano))
	}
	var members []string
	if t.first != nil && t.first.set != nil {
		members = t.first.set.wrong
	}
	attrs = append(attrs, "history", o.historyText(c.key, members))
	o.log.Error("cache inconsistent with an applied change", attrs...)
}

// historyText renders the latest batches the daemon applied to key (and
// the latest that changed each of members, a set's members in question),
// oldest first, for a report: when, which op, what memcached answered,
// which daemon instance, which batch. A change another process wrote to
// the item shows as a state the history does not explain.
func (o *Observer) historyText(key string, members []string) string {
	h := o.watch.history(key, members)
	if len(h) == 0 {
		return "none recorded"
	}
	parts := make([]string, len(h))
	for i, a := range h {
		parts[i] = a.String(o.deps.Member)
	}
	return strings.Join(parts, "; ")
}

// taskHeap orders tasks by due time.
type taskHeap []*task

func (h taskHeap) Len() int           { return len(h) }
func (h taskHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h taskHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *taskHeap) Push(x any)        { *h = append(*h, x.(*task)) }
func (h *taskHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return t
}

// bucket is a token bucket: rate tokens a second, at most max(rate, 1)
// kept. It is safe for concurrent use.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	at     time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	return &bucket{rate: rate, tokens: max(rate, 1), at: now}
}

// take removes n tokens when there are that many (a request larger than
// the bucket is allowed when the bucket is full).
func (b *bucket) take(n float64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	burst := max(b.rate, 1)
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(burst, b.tokens+d.Seconds()*b.rate)
		b.at = now
	}
	if b.tokens >= n || b.tokens >= burst {
		b.tokens -= n
		return true
	}
	return false
}
