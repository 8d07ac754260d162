package observer

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// What the daemon applied to the keys under observation.
//
// A set member may change again before a window's read: added, then
// removed a few milliseconds later. The set that lacks it then is right,
// and judging it against the sampled change's row image would report a
// correct set. So the observer keeps, for every key of a sampled change
// still waiting for a check, the latest change the daemon applied to
// each set member of that key (and a short history of the batches that
// touched the key, for the evidence of a report), and judges each member
// against that.

const (
	// maxTrackedMembers bounds the members recorded per watched set key;
	// a member first changed beyond it is not recorded, and is not judged
	// by the checks of that key.
	maxTrackedMembers = 4096
	// historyLen is how many applications of a watched key its history
	// keeps (the latest ones).
	historyLen = 8
	// maxDetail bounds the op detail (tokens, delta) kept per application.
	maxDetail = 120
)

// memberRecord is the latest change the daemon applied to one member.
type memberRecord struct {
	// in is whether the change left the member in the set.
	in bool
	// known is false when the last application left the member's state
	// unknown (the op failed, the set was deleted or rebuilt).
	known bool
	// seq is the key's application number of that change; it tells
	// whether the member changed between two readings.
	seq uint64
	// last is that application, for the history of a report.
	last application
	// busy is set (by latest) while a change of the member is being
	// applied: memcached may hold it before the record does.
	busy bool
}

// application is one op applied to a watched key, as the daemon saw it.
type application struct {
	// seq is the key's application number.
	seq     uint64
	at      time.Time
	kind    rules.OpKind
	detail  string
	source  rules.Position
	outcome string
}

// String renders the application for a report:
// "02:50:01.123Z set_add +red appended by host-1 batch cdc.app.tags/0@17".
func (a application) String(member string) string {
	var b strings.Builder
	b.WriteString(a.at.UTC().Format("15:04:05.000Z"))
	b.WriteByte(' ')
	b.WriteString(a.kind.String())
	if a.detail != "" {
		b.WriteByte(' ')
		b.WriteString(a.detail)
	}
	b.WriteString(" answered ")
	b.WriteString(a.outcome)
	if member != "" {
		b.WriteString(" by ")
		b.WriteString(member)
	}
	if a.source.Topic != "" {
		fmt.Fprintf(&b, " batch %s/%d@%d", a.source.Topic, a.source.Partition, a.source.Offset)
	}
	return b.String()
}

// watched is what is known of one watched key.
type watched struct {
	// refs counts the sampled changes of the key still waiting for a
	// check.
	refs    int
	seq     uint64
	members map[string]memberRecord
	// history is a ring of the latest applications; n counts them all.
	history [historyLen]application
	n       int
	// inflight counts, per member, the changes being applied (begin to
	// record); inflightAll the deletes and rebuilds of the whole set.
	inflight    map[string]int
	inflightAll int
}

// inflight is one change of a watched key being applied: a member, or
// "" for the whole set.
type inflight struct {
	// k is the watched key as begin found it (a key released and
	// watched again meanwhile is another one).
	k      *watched
	member string
	all    bool
}

// watchList holds the watched keys. Safe for concurrent use.
type watchList struct {
	mu   sync.Mutex
	keys map[string]*watched
	// size is len(keys), read without the lock on the path of every
	// batch.
	size atomic.Int64
}

// add watches key for one more sampled change.
func (w *watchList) add(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = make(map[string]*watched)
	}
	k := w.keys[key]
	if k == nil {
		k = &watched{}
		w.keys[key] = k
		w.size.Add(1)
	}
	k.refs++
}

// release ends one sampled change's watch of key.
func (w *watchList) release(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.keys[key]
	if k == nil {
		return
	}
	if k.refs--; k.refs <= 0 {
		delete(w.keys, key)
		w.size.Add(-1)
	}
}

// begin notes the set changes of ops, a batch about to be applied, on
// watched keys as in flight, and reports whether an op is on a watched
// key. The changes it returns are passed to record once the batch has
// been applied; until then their members are not judged (a batch that
// is never recorded leaves them so until their key is released).
func (w *watchList) begin(ops []rules.Op) (flight []inflight, watching bool) {
	if w.size.Load() == 0 {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range ops {
		op := &ops[i]
		k := w.keys[op.Key]
		if k == nil {
			continue
		}
		watching = true
		note := func(m string) {
			if k.inflight == nil {
				k.inflight = make(map[string]int)
			}
			if _, ok := k.inflight[m]; !ok && len(k.inflight) >= maxTrackedMembers {
				// Past the bound: the whole set is taken as in flight.
				k.inflightAll++
				flight = append(flight, inflight{k: k, all: true})
				return
			}
			k.inflight[m]++
			flight = append(flight, inflight{k: k, member: m})
		}
		switch op.Kind {
		case rules.OpSetAdd, rules.OpSetRemove:
			note(op.Member)
		case rules.OpSetAppend:
			for _, t := range itemformat.SetTokens([]byte(op.Tokens)) {
				if len(t) > 1 && (t[0] == '+' || t[0] == '-') {
					note(string(t[1:]))
				}
			}
		case rules.OpSetDelete, rules.OpSetRebuild:
			k.inflightAll++
			flight = append(flight, inflight{k: k, all: true})
		}
	}
	return flight, watching
}

// record notes the ops of an applied batch that are on watched keys,
// with their results, at now; ops without a result are taken as failed.
// detached notes ops another process applies (`cachewarden observe`):
// their results say nothing of memcached's answers.
//
// flight are the changes begin noted for the batch: they are no longer
// in flight.
func (w *watchList) record(ops []rules.Op, res []cacheops.Result, now time.Time, detached bool, flight []inflight) {
	if w.size.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range flight {
		k := f.k
		switch {
		case f.all:
			k.inflightAll--
		case k.inflight[f.member] <= 1:
			delete(k.inflight, f.member)
		default:
			k.inflight[f.member]--
		}
	}
	for i := range ops {
		op := &ops[i]
		k := w.keys[op.Key]
		if k == nil {
			continue
		}
		r := cacheops.Result{Err: errNoResult}
		if i < len(res) {
			r = res[i]
		}
		k.seq++
		a := application{seq: k.seq, at: now, kind: op.Kind, source: rules.Position{Topic: op.Source.Topic, Partition: op.Source.Partition, Offset: op.Source.Offset}, outcome: r.Outcome.String()}
		switch {
		case detached:
			a.outcome = "unknown (applied by another process)"
		case r.Err != nil:
			a.outcome = "failed: " + r.Err.Error()
		}
		switch op.Kind {
		case rules.OpSetAdd:
			a.detail = clip("+" + op.Member)
			k.note(op.Member, true, r.Err == nil, &a)
		case rules.OpSetRemove:
			a.detail = clip("-" + op.Member)
			k.note(op.Member, false, r.Err == nil, &a)
		case rules.OpSetAppend:
			a.detail = clip(op.Tokens)
			for _, t := range itemformat.SetTokens([]byte(op.Tokens)) {
				if len(t) > 1 && (t[0] == '+' || t[0] == '-') {
					k.note(string(t[1:]), t[0] == '+', r.Err == nil, &a)
				}
			}
		case rules.OpSetDelete, rules.OpSetRebuild:
			// Every member's state is now what MySQL (or nothing) says.
			for m := range k.members {
				k.members[m] = memberRecord{seq: k.seq, last: a}
			}
		case rules.OpCount:
			a.detail = strconv.FormatInt(op.Delta, 10)
		}
		k.history[k.n%historyLen] = a
		k.n++
	}
}

// clip bounds an op's detail to maxDetail bytes.
func clip(s string) string {
	if len(s) > maxDetail {
		return strings.Clone(s[:maxDetail]) + "…"
	}
	return strings.Clone(s)
}

// errNoResult is the error of an op the applier returned no result for.
var errNoResult = errors.New("no result")

// note records a change of member at the key's current application a
// (its detail, filled in later, is shared: a points to it).
func (k *watched) note(member string, in, applied bool, a *application) {
	if k.members == nil {
		k.members = make(map[string]memberRecord)
	}
	if _, ok := k.members[member]; !ok && len(k.members) >= maxTrackedMembers {
		return
	}
	k.members[member] = memberRecord{in: in, known: applied, seq: k.seq, last: *a}
}

// latest returns the records of members of key (absent: not recorded).
func (w *watchList) latest(key string, members []string) map[string]memberRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]memberRecord, len(members))
	k := w.keys[key]
	if k == nil {
		return out
	}
	for _, m := range members {
		r, ok := k.members[m]
		if busy := k.inflightAll > 0 || k.inflight[m] > 0; busy {
			r.busy, ok = true, true
		}
		if ok {
			out[m] = r
		}
	}
	return out
}

// history returns the latest applications to key and, before them, the
// latest application to each of members that is older, oldest first.
func (w *watchList) history(key string, members []string) []application {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.keys[key]
	if k == nil {
		return nil
	}
	n := min(k.n, historyLen)
	var out []application
	seen := map[uint64]bool{}
	for i := k.n - n; i < k.n; i++ {
		seen[k.history[i%historyLen].seq] = true
	}
	for _, m := range members {
		if r, ok := k.members[m]; ok && r.last.seq != 0 && !seen[r.last.seq] {
			seen[r.last.seq] = true
			out = append(out, r.last)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	for i := k.n - n; i < k.n; i++ {
		out = append(out, k.history[i%historyLen])
	}
	return out
}
