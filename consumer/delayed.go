package consumer

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// rebumpAttempts bounds how often one delayed bump is tried before it is
// dropped (logged and counted). The first bump was applied already, so a
// dropped second bump only shortens the hold-off.
const rebumpAttempts = 5

// Rebumper applies the delayed second bump of rules with rebump_after
// (docs/rules.md, rebump_after). Pending bumps live in memory only and never hold back a
// commit; Flush applies them all at once on shutdown, so only a crash
// drops them. One pending bump is kept per key: scheduling a key again
// moves its bump to the later time, because the new first bump restarts
// the hold-off.
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
}

type rebump struct {
	op       rules.Op
	due      time.Time
	attempts int
	index    int // in queue
}

// NewRebumper returns a Rebumper applying bumps with w (a
// *cacheops.Writer). m and logger may be nil.
func NewRebumper(w Applier, m *Metrics, logger *slog.Logger) *Rebumper {
	if m == nil {
		m = NewMetrics(nil)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Rebumper{
		w: w, m: m, log: logger, now: time.Now,
		byKey:   make(map[string]*rebump),
		wake:    make(chan struct{}, 1),
		backoff: time.Second,
	}
}

// Schedule plans a second bump of op.Key op.Rule.RebumpAfter from now. Ops
// that are not bumps or whose rule has no rebump_after are ignored.
func (r *Rebumper) Schedule(op rules.Op) {
	if op.Kind != rules.OpBump || op.Rule == nil || op.Rule.RebumpAfter <= 0 {
		return
	}
	due := r.now().Add(op.Rule.RebumpAfter)
	r.mu.Lock()
	if rb, ok := r.byKey[op.Key]; ok {
		if due.After(rb.due) {
			rb.due = due
			rb.op.Rule = op.Rule
			rb.attempts = 0
			heap.Fix(&r.queue, rb.index)
		}
		r.mu.Unlock()
		return
	}
	rb := &rebump{op: op, due: due}
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
}

// Pending returns the number of delayed bumps waiting.
func (r *Rebumper) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// Run applies delayed bumps as they come due until ctx ends; it returns
// nil then. Bumps still pending stay for Flush.
func (r *Rebumper) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
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
		if sleep(ctx, min(50*time.Millisecond<<min(attempt, 6), 2*time.Second)) != nil {
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
	_ = r.w.Apply(ctx, ops, results)
	var failed []*rebump
	for i, rb := range bumps {
		err := results[i].Err
		switch {
		case err == nil:
			r.m.rebumps.WithLabelValues("ok").Inc()
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
					continue
				}
				r.requeue(rb, rb.due) // shutting down: Flush takes it
				continue
			}
			r.m.rebumps.WithLabelValues("error").Inc()
			r.requeue(rb, r.now().Add(r.backoff<<(rb.attempts-1)))
		default:
			r.m.rebumps.WithLabelValues("dropped").Inc()
			r.log.Error("delayed bump failed permanently", "key", rb.op.Key, "rule", ruleName(&rb.op), "error", err.Error())
		}
	}
	return failed
}

// requeue puts a bump back unless the key was scheduled again meanwhile
// (the newer bump supersedes it).
func (r *Rebumper) requeue(rb *rebump, due time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byKey[rb.op.Key]; ok {
		return
	}
	rb.due = due
	r.byKey[rb.op.Key] = rb
	heap.Push(&r.queue, rb)
	r.m.rebumpsPending.Set(float64(len(r.queue)))
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
