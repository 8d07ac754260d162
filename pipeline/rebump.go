package pipeline

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/rules"
)

// rebumpAttempts bounds how often one delayed bump is tried before it is
// dropped (logged and counted). The first bump was applied already, so a
// dropped second bump only shortens the hold-off.
const rebumpAttempts = 5

// DefaultMaxPendingRebumps is the default bound on the delayed bumps a
// DefaultFlushTimeout bounds applying the pending delayed bumps when a
// source stops (Rebumper.Flush): the Kafka daemon's shutdown_timeout and
// the end of a replay.
const DefaultFlushTimeout = 10 * time.Second

// Rebumper holds (one per key changed within its rule's rebump_after).
// Past it, the bumps due first are applied at once, before their time: a
// bump is never wrong, applied early it only shortens that key's
// hold-off. At about 200 bytes of memory per bump it bounds them to some
// 20 MB.
const DefaultMaxPendingRebumps = 100_000

// Rebump journal timing (Rebumper.EnableJournal).
const (
	// RebumpScanInterval is how often a running daemon reads its group's
	// journal for bumps that no daemon applied.
	RebumpScanInterval = 10 * time.Second
	// RebumpOrphanGrace is how long past its due time a recorded bump
	// must be before a daemon that did not schedule it applies it (its
	// own daemon normally applies it on time).
	RebumpOrphanGrace = 5 * time.Second
)

// Rebumper applies the delayed second bump of rules with rebump_after
// (docs/rules.md). Pending bumps wait in memory and never hold back a
// commit beyond being recorded; Flush applies them all at once on
// shutdown. One pending bump is kept per key: scheduling a key again
// moves its bump to the later time, because the new first bump restarts
// the hold-off. So the bumps pending are the keys changed within their
// rule's rebump_after, at most maxPending (DefaultMaxPendingRebumps):
// beyond, the bumps due first are applied early (counted in
// cachewarden_rebumps_early_total{reason="max_pending"}).
//
// With a journal (EnableJournal, the daemon's), ScheduleBatch also
// records each bump in memcached before the batch that scheduled it is
// committed, and an applied bump is removed from the journal, so a crash
// drops none. The journal holds one entry per pending bump: a key
// scheduled again replaces its entry in the same append. A journal item
// is so bounded by the bumps pending in it; when it reaches memcached's
// item size limit, the bumps recorded in it that are due first (half of
// them) are applied early and removed, to make room (reason
// "journal_full"), and the batch's record is written again. Run first
// applies what the journal holds (what a killed daemon left), and every
// RebumpScanInterval applies recorded bumps more than RebumpOrphanGrace
// overdue (left by a daemon of the group that stopped). A bump found in the journal may be applied twice, by its own
// daemon and by another: a bump is always safe to repeat. Without a
// journal, only a crash drops pending bumps (the first bump was applied
// already).
//
// A Rebumper is safe for concurrent use. Run it with Run; without Run,
// bumps wait until Flush.
type Rebumper struct {
	w   Applier
	m   *Metrics
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	byKey   map[string]*rebump
	queue   rebumpQueue
	wake    chan struct{}
	backoff time.Duration

	// journal records pending bumps in memcached; nil keeps them in
	// memory only. scanEvery and orphanGrace default to
	// RebumpScanInterval and RebumpOrphanGrace.
	journal     *rebumpJournal
	scanEvery   time.Duration
	orphanGrace time.Duration
	// maxPending bounds the bumps held; DefaultMaxPendingRebumps.
	maxPending int

	// observer samples the delayed bumps as the pipeline's observer
	// samples first bumps; nil observes none (SetObserver).
	observer ChangeObserver
}

// SetObserver makes the consistency observer sample and check the
// delayed bumps the Rebumper applies, as it does the first bumps. Call it
// before Run.
func (r *Rebumper) SetObserver(o ChangeObserver) { r.observer = o }

type rebump struct {
	op       rules.Op
	due      time.Time
	attempts int
	index    int // in queue
	// entry is where the bump is recorded in the journal (zero when it
	// is not); removed once the bump is applied or superseded.
	entry journalEntry
}

// NewRebumper returns a Rebumper applying bumps with w (a
// *cacheops.Applier). m and logger may be nil.
func NewRebumper(w Applier, m *Metrics, logger *slog.Logger) *Rebumper {
	if m == nil {
		m = NewMetrics(nil)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Rebumper{
		w: w, m: m, log: logger, now: time.Now,
		byKey:       make(map[string]*rebump),
		wake:        make(chan struct{}, 1),
		backoff:     time.Second,
		scanEvery:   RebumpScanInterval,
		orphanGrace: RebumpOrphanGrace,
		maxPending:  DefaultMaxPendingRebumps,
	}
}

// EnableJournal makes the Rebumper record its pending bumps in the
// journal items of consumer group under the prefixes of rs's rule files
// (RebumpJournalKey), kept by store (a *cacheops.TokenLog). Call it before
// Run and before the first ScheduleBatch.
func (r *Rebumper) EnableJournal(store journalStore, rs *rules.RuleSet, group string) {
	r.journal = newRebumpJournal(store, rs, group)
}

// rebumps reports whether op asks for a delayed second bump.
func rebumps(op *rules.Op) bool {
	return op.Kind == rules.OpBump && op.Rule != nil && op.Rule.RebumpAfter > 0
}

// Schedule plans a second bump of op.Key op.Rule.RebumpAfter from now, in
// memory only (ScheduleBatch records it in the journal too). Ops that are
// not bumps or whose rule has no rebump_after are ignored.
func (r *Rebumper) Schedule(op rules.Op) {
	if !rebumps(&op) {
		return
	}
	r.scheduleAt(op, r.now().Add(op.Rule.RebumpAfter), journalEntry{})
	r.trim(context.Background())
}

// ScheduleBatch plans the second bumps of a batch's applied ops (those
// that are bumps of rules with rebump_after; one per key) and, with a
// journal, records them in memcached first, each replacing the entry of
// the key's earlier pending bump: the caller commits the batch only after
// it returns nil. A journal item full to memcached's item size limit is
// made room in by applying early the bumps due first (see Rebumper).
// Transient memcached errors are retried with backoff until ctx ends (it
// then returns ctx's error: the batch must not be committed); another
// permanent one is logged and counted, and the bumps wait in memory only.
// Each journal write asks ctx's write guard first (cacheops.WithGuard):
// when it refuses, nothing is recorded or scheduled and the refusal
// (ErrWriteRefused) is returned.
func (r *Rebumper) ScheduleBatch(ctx context.Context, ops []rules.Op) error {
	var plan []plannedRebump
	byKey := make(map[string]int)
	now := r.now()
	for i := range ops {
		op := &ops[i]
		if !rebumps(op) {
			continue
		}
		p := plannedRebump{op: *op, due: now.Add(op.Rule.RebumpAfter)}
		if j, ok := byKey[op.Key]; ok {
			if p.due.After(plan[j].due) {
				plan[j] = p
			}
			continue
		}
		byKey[op.Key] = len(plan)
		plan = append(plan, p)
	}
	if len(plan) == 0 {
		return nil
	}
	if r.journal != nil {
		var err error
		if plan, err = r.record(ctx, plan); err != nil {
			return err
		}
	}
	var superseded []journalEntry
	for _, p := range plan {
		if old := r.scheduleAt(p.op, p.due, p.entry); old != (journalEntry{}) && old != p.replaces {
			superseded = append(superseded, old)
		}
	}
	r.unrecord(superseded)
	r.trim(ctx)
	return nil
}

// plannedRebump is a bump ScheduleBatch plans: its journal entry, and the
// entry of the key's pending bump it replaces (zero when none).
type plannedRebump struct {
	op              rules.Op
	due             time.Time
	entry, replaces journalEntry
}

// record adds the journal entries of plan, removing in the same appends
// those of the pending bumps they replace, and returns what remains of
// plan: a bump already pending with a due time as late is not recorded
// again, and bumps taken out to make room in a full journal item were
// applied. It retries transient errors until ctx ends or ctx's write
// guard refuses (its error is returned: a refused write is not a journal
// failure).
func (r *Rebumper) record(ctx context.Context, plan []plannedRebump) ([]plannedRebump, error) {
	for attempt := 0; ; {
		if err := cacheops.CheckGuard(ctx); err != nil {
			return nil, err
		}
		plan = r.prepare(plan)
		if len(plan) == 0 {
			return plan, nil
		}
		full, err := r.journal.write(plan)
		switch {
		case err == nil:
			return plan, nil
		case len(full) > 0:
			var roomErr error
			if plan, roomErr = r.makeRoom(ctx, plan, full); roomErr == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil, roomErr
			}
			err = roomErr
			fallthrough
		case !cacheops.Retryable(err):
			r.m.rebumpJournalErrors.WithLabelValues("record").Inc()
			r.log.Error("cannot record delayed bumps in memcached; they wait in memory only", "bumps", len(plan), "error", err.Error())
			for i := range plan {
				plan[i].entry, plan[i].replaces = journalEntry{}, journalEntry{}
			}
			return plan, nil
		}
		r.m.rebumpJournalErrors.WithLabelValues("record").Inc()
		wait := rebumpRetryWait(attempt)
		if retry.Logged(attempt) {
			r.log.Warn("cannot record delayed bumps in memcached; retrying, the partition waits",
				"bumps", len(plan), "attempt", attempt+1, "retry_in", wait, "error", err.Error())
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return nil, err
		}
		attempt++
	}
}

// prepare sets the journal entries of plan from the bumps pending now:
// a bump whose key has one pending as late or later is dropped (that
// bump covers it), one that replaces a pending bump names its entry.
func (r *Rebumper) prepare(plan []plannedRebump) []plannedRebump {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := plan[:0]
	for _, p := range plan {
		p.replaces = journalEntry{}
		if rb, ok := r.byKey[p.op.Key]; ok {
			if !p.due.After(rb.due) {
				continue
			}
			p.replaces = rb.entry
		}
		p.entry = r.journal.entryFor(&p.op, p.due)
		if p.replaces == p.entry {
			p.replaces = journalEntry{}
		}
		out = append(out, p)
	}
	return out
}

// makeRoom makes room in the journal items full (at memcached's item size
// limit) by applying early the earlier half of the bumps recorded in each
// (at least one) and removing their entries; an item that holds none of
// them cannot take even plan's entries, and the earlier half of those are
// applied now instead of recorded. It returns what remains of plan; an
// error wrapping ctx's when it ended, one wrapping cacheops.ErrTooLarge
// when it found nothing to take.
func (r *Rebumper) makeRoom(ctx context.Context, plan []plannedRebump, full []string) ([]plannedRebump, error) {
	var early []*rebump
	fromPlan := 0
	for _, item := range full {
		if held := r.takeEarliestIn(item); len(held) > 0 {
			early = append(early, held...)
			continue
		}
		var mine []int
		for i, p := range plan {
			if p.entry.item == item {
				mine = append(mine, i)
			}
		}
		slices.SortStableFunc(mine, func(a, b int) int { return plan[a].due.Compare(plan[b].due) })
		take := make(map[int]bool)
		for _, i := range mine[:(len(mine)+1)/2] {
			take[i] = true
			early = append(early, &rebump{op: plan[i].op, due: plan[i].due})
		}
		fromPlan += len(take)
		kept := plan[:0]
		for i, p := range plan {
			if !take[i] {
				kept = append(kept, p)
			}
		}
		plan = kept
	}
	if len(early) == 0 {
		return plan, fmt.Errorf("pipeline: rebump journal items %q full with no bump of this daemon or batch in them: %w", full, cacheops.ErrTooLarge)
	}
	r.m.rebumpsEarly.WithLabelValues("journal_full").Add(float64(len(early)))
	r.log.Warn("delayed bump journal item full; applying the bumps due first now",
		"items", full, "bumps", len(early), "of_this_batch", fromPlan)
	r.apply(ctx, early, true)
	return plan, ctx.Err()
}

// takeEarliestIn removes and returns the earlier half (at least one) of
// the pending bumps recorded in journal item.
func (r *Rebumper) takeEarliestIn(item string) []*rebump {
	r.mu.Lock()
	defer r.mu.Unlock()
	var in []*rebump
	for _, rb := range r.queue {
		if rb.entry.item == item {
			in = append(in, rb)
		}
	}
	if len(in) == 0 {
		return nil
	}
	slices.SortFunc(in, func(a, b *rebump) int { return a.due.Compare(b.due) })
	in = in[:(len(in)+1)/2]
	for _, rb := range in {
		heap.Remove(&r.queue, rb.index)
		delete(r.byKey, rb.op.Key)
	}
	r.m.rebumpsPending.Set(float64(len(r.queue)))
	return in
}

// trim applies early the bumps due first while more than maxPending are
// pending.
func (r *Rebumper) trim(ctx context.Context) {
	r.mu.Lock()
	var early []*rebump
	for len(r.queue) > r.maxPending {
		rb := heap.Pop(&r.queue).(*rebump)
		delete(r.byKey, rb.op.Key)
		early = append(early, rb)
	}
	r.m.rebumpsPending.Set(float64(len(r.queue)))
	r.mu.Unlock()
	if len(early) == 0 {
		return
	}
	r.m.rebumpsEarly.WithLabelValues("max_pending").Add(float64(len(early)))
	r.log.Warn("more delayed bumps pending than the bound; applying the bumps due first now",
		"bumps", len(early), "max_pending", r.maxPending)
	r.apply(ctx, early, true)
}

// rebumpRetryWait is the wait before retry attempt+1 of a journal write
// or of Flush: 50ms doubled per attempt, at most 2s.
func rebumpRetryWait(attempt int) time.Duration {
	return min(50*time.Millisecond<<min(attempt, 6), 2*time.Second)
}

// scheduleAt plans a bump of op.Key at due recorded at entry (zero when
// not recorded). One bump is kept per key, the later; it returns the
// entry of the other, which the caller removes from the journal (zero
// when none).
func (r *Rebumper) scheduleAt(op rules.Op, due time.Time, entry journalEntry) (superseded journalEntry) {
	r.mu.Lock()
	if rb, ok := r.byKey[op.Key]; ok {
		defer r.mu.Unlock()
		if !due.After(rb.due) {
			if entry == rb.entry {
				return journalEntry{}
			}
			return entry
		}
		superseded = rb.entry
		if superseded == entry {
			superseded = journalEntry{}
		}
		rb.due, rb.entry = due, entry
		rb.op.Rule = op.Rule
		rb.attempts = 0
		heap.Fix(&r.queue, rb.index)
		return superseded
	}
	rb := &rebump{op: op, due: due, entry: entry}
	rb.op.Args = nil // a bump needs no query args; do not pin event data
	r.byKey[op.Key] = rb
	heap.Push(&r.queue, rb)
	first := r.queue[0] == rb
	r.m.rebumpsPending.Set(float64(len(r.queue)))
	r.mu.Unlock()
	if first {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return journalEntry{}
}

// Pending returns the number of delayed bumps waiting.
func (r *Rebumper) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// Run applies delayed bumps as they come due until ctx ends; it returns
// nil then. Bumps still pending stay for Flush. With a journal it first
// schedules every bump the journal holds, and scans it again every
// scanEvery for bumps no daemon applied.
func (r *Rebumper) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var scan <-chan time.Time
	recovered := false
	if r.journal != nil {
		recovered = r.recoverJournal(0)
		ticker := time.NewTicker(r.scanEvery)
		defer ticker.Stop()
		scan = ticker.C
	}
	for {
		due := r.takeDue(r.now())
		if len(due) > 0 {
			r.apply(ctx, due, true)
			if ctx.Err() != nil {
				// The bumps the ended ctx failed are queued again, still
				// due: leave them to Flush rather than try them again.
				return nil
			}
			continue
		}
		wait := time.Hour
		r.mu.Lock()
		if len(r.queue) > 0 {
			wait = max(r.queue[0].due.Sub(r.now()), time.Millisecond)
		}
		r.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
			timer.Stop()
		case <-timer.C:
		case <-scan:
			timer.Stop()
			// Until one read succeeded, a scan takes every bump.
			grace := r.orphanGrace
			if !recovered {
				grace = 0
			}
			recovered = r.recoverJournal(grace) || recovered
		}
	}
}

// Flush applies every pending bump now, whatever its due time. Bumps that
// fail with a transient error are retried with a short backoff until ctx
// ends; those still failing then are dropped (logged and counted). It
// returns the number of bumps dropped.
func (r *Rebumper) Flush(ctx context.Context) int {
	all := r.takeDue(time.Time{})
	if len(all) == 0 {
		return 0
	}
	r.log.Info("applying pending delayed bumps", "bumps", len(all))
	for attempt := 0; len(all) > 0; attempt++ {
		all = r.apply(ctx, all, false)
		if len(all) == 0 || ctx.Err() != nil {
			break
		}
		if retry.Sleep(ctx, rebumpRetryWait(attempt)) != nil {
			break
		}
	}
	if len(all) > 0 {
		r.m.rebumps.WithLabelValues("dropped").Add(float64(len(all)))
		r.log.Error("delayed bumps dropped at shutdown", "bumps", len(all))
	}
	return len(all)
}

// takeDue removes and returns the bumps due at now; a zero now takes all.
func (r *Rebumper) takeDue(now time.Time) []*rebump {
	r.mu.Lock()
	defer r.mu.Unlock()
	var due []*rebump
	for len(r.queue) > 0 && (now.IsZero() || !r.queue[0].due.After(now)) {
		rb := heap.Pop(&r.queue).(*rebump)
		delete(r.byKey, rb.op.Key)
		due = append(due, rb)
	}
	r.m.rebumpsPending.Set(float64(len(r.queue)))
	return due
}

// apply applies bumps and returns those that failed with a retryable
// error. With requeue, those are scheduled again a little later (until
// rebumpAttempts) instead of returned.
func (r *Rebumper) apply(ctx context.Context, bumps []*rebump, requeue bool) []*rebump {
	ops := make([]rules.Op, len(bumps))
	for i, rb := range bumps {
		ops[i] = rb.op
	}
	results := make([]cacheops.Result, len(ops))
	var observed func([]rules.Op, []cacheops.Result)
	if r.observer != nil {
		observed = r.observer.BeforeApply(ctx, ops)
	}
	_ = r.w.Apply(ctx, ops, results)
	if observed != nil {
		observed(ops, results)
	}
	var failed []*rebump
	var done []journalEntry
	defer func() { r.unrecord(done) }()
	for i, rb := range bumps {
		err := results[i].Err
		switch {
		case err == nil:
			r.m.rebumps.WithLabelValues("ok").Inc()
			done = appendEntry(done, rb.entry)
		case cacheops.Retryable(err) || ctx.Err() != nil:
			rb.attempts++
			if !requeue {
				failed = append(failed, rb)
				continue
			}
			if rb.attempts >= rebumpAttempts || ctx.Err() != nil {
				if ctx.Err() == nil {
					r.m.rebumps.WithLabelValues("dropped").Inc()
					r.log.Error("delayed bump dropped", "key", rb.op.Key, "rule", ruleName(&rb.op), "attempts", rb.attempts, "error", err.Error())
					continue // its journal entry stays: a scan applies it later
				}
				done = appendEntry(done, r.requeue(rb, rb.due)) // shutting down: Flush takes it
				continue
			}
			r.m.rebumps.WithLabelValues("error").Inc()
			done = appendEntry(done, r.requeue(rb, r.now().Add(r.backoff<<(rb.attempts-1))))
		default:
			r.m.rebumps.WithLabelValues("dropped").Inc()
			r.log.Error("delayed bump failed permanently", "key", rb.op.Key, "rule", ruleName(&rb.op), "error", err.Error())
			done = appendEntry(done, rb.entry)
		}
	}
	return failed
}

// appendEntry appends e to entries unless it is zero.
func appendEntry(entries []journalEntry, e journalEntry) []journalEntry {
	if e == (journalEntry{}) {
		return entries
	}
	return append(entries, e)
}

// unrecord removes the journal entries of bumps that are done. A failure
// leaves them recorded: a later scan, or the next start, applies the
// bump again, which is harmless.
func (r *Rebumper) unrecord(entries []journalEntry) {
	if r.journal == nil || len(entries) == 0 {
		return
	}
	if err := r.journal.remove(entries); err != nil {
		r.m.rebumpJournalErrors.WithLabelValues("remove").Inc()
		r.log.Warn("cannot remove applied delayed bumps from the journal; they will be applied again", "bumps", len(entries), "error", err.Error())
	}
}

// recoverJournal schedules the bumps recorded in the journal that this
// Rebumper does not hold, at their due time (at once when overdue), and
// removes unreadable entries. With a grace above 0 it takes only bumps
// overdue by more than grace (their daemon stopped). It reports whether
// the journal could be read.
func (r *Rebumper) recoverJournal(grace time.Duration) bool {
	pending, bad, err := r.journal.read()
	if err != nil {
		r.m.rebumpJournalErrors.WithLabelValues("read").Inc()
		r.log.Warn("cannot read the delayed bumps recorded in memcached; trying again later", "error", err.Error())
		return false
	}
	if len(bad) > 0 {
		r.log.Warn("removing unreadable entries from the delayed bump journal", "entries", len(bad))
		r.unrecord(bad)
	}
	held := r.heldEntries()
	now := r.now()
	n := 0
	var superseded []journalEntry
	for _, pr := range pending {
		e := journalEntry{item: pr.Journal, member: pr.member}
		if held[e] || (grace > 0 && now.Sub(pr.Due) <= grace) {
			continue
		}
		superseded = appendEntry(superseded, r.scheduleAt(r.journal.op(pr), pr.Due, e))
		n++
	}
	// A key recorded more than once (by daemons that each held a bump of
	// it) keeps the later bump.
	r.unrecord(superseded)
	if n > 0 {
		r.m.rebumpsRecovered.Add(float64(n))
		r.log.Info("scheduled delayed bumps found in memcached", "bumps", n, "overdue_by_more_than", grace)
	}
	return true
}

// heldEntries returns the journal entries of the bumps held in memory.
func (r *Rebumper) heldEntries() map[journalEntry]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := make(map[journalEntry]bool)
	for _, rb := range r.byKey {
		if rb.entry != (journalEntry{}) {
			held[rb.entry] = true
		}
	}
	return held
}

// requeue puts a bump back unless the key was scheduled again meanwhile
// (the newer bump supersedes it: it returns the entry of rb then, which
// the caller removes from the journal).
func (r *Rebumper) requeue(rb *rebump, due time.Time) (superseded journalEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if newer, ok := r.byKey[rb.op.Key]; ok {
		if rb.entry == newer.entry {
			return journalEntry{}
		}
		return rb.entry
	}
	rb.due = due
	r.byKey[rb.op.Key] = rb
	heap.Push(&r.queue, rb)
	r.m.rebumpsPending.Set(float64(len(r.queue)))
	return journalEntry{}
}

// rebumpQueue is a min-heap of bumps by due time.
type rebumpQueue []*rebump

func (q rebumpQueue) Len() int           { return len(q) }
func (q rebumpQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q rebumpQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *rebumpQueue) Push(x any) {
	rb := x.(*rebump)
	rb.index = len(*q)
	*q = append(*q, rb)
}
func (q *rebumpQueue) Pop() any {
	old := *q
	rb := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return rb
}
