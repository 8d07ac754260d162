package observer

import (
	"bytes"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// reading is what one check of a set or counter read: the item and the
// truth, kept to confirm a mismatch.
type reading struct {
	item    Item
	count   int64
	members []string
	// at is set for a counter judged at a binary log position.
	at *atPosition
	// set is a set's view of the members in question.
	set *setReading
}

// setReading is one reading of a set, for the members in question: is
// each in the set, should it be (the latest change the daemon applied
// to it, or the load query), and which application of the key last
// changed it.
type setReading struct {
	in, want map[string]bool
	seq      map[string]uint64
	// wrong are the members in question whose presence differs from
	// what it should be, sorted.
	wrong []string
	// unknown counts the members in question with no known latest
	// change (no load query only) or a change in flight.
	unknown int
	// busy holds the members with a change in flight: not judged.
	busy map[string]bool
}

// readSet builds the view of members of the set item read at key. truth
// is the load query's members (nil: judge against the latest change the
// daemon applied to each member).
func (o *Observer) readSet(key string, item Item, members []string, truth map[string]bool) *setReading {
	return viewSet(item, members, truth, o.watch.latest(key, members))
}

// viewSet builds the view of members in the set item: each should be in
// the set as truth says (the load query's members) or, with truth nil,
// as its latest applied change in latest says (a member without a known
// one is counted unknown and not judged).
func viewSet(item Item, members []string, truth map[string]bool, latest map[string]memberRecord) *setReading {
	present := toSet(itemformat.DecodeSet(item.Value).Members)
	s := &setReading{in: map[string]bool{}, want: map[string]bool{}, seq: map[string]uint64{}, busy: map[string]bool{}}
	for _, m := range members {
		rec := latest[m]
		s.seq[m] = rec.seq
		s.in[m] = present[m]
		if rec.busy {
			s.busy[m] = true
			s.unknown++
			continue
		}
		if truth != nil {
			s.want[m] = truth[m]
		} else if !rec.known {
			s.unknown++
			continue
		} else {
			s.want[m] = rec.in
		}
		if s.in[m] != s.want[m] {
			s.wrong = append(s.wrong, m)
		}
	}
	sort.Strings(s.wrong)
	return s
}

// verdict judges the view: inconsistent, with the members' states as
// evidence, when members are wrong; not judged when no member's state is
// known.
func (s *setReading) verdict(members []string) verdict {
	if len(members) > 0 {
		var exp, seen []string
		for _, m := range members {
			exp = append(exp, memberState(m, s.want[m]))
			seen = append(seen, memberState(m, s.in[m]))
		}
		return verdict{Inconsistent, strings.Join(exp, " "), strings.Join(seen, " ")}
	}
	if len(s.in) > 0 && len(s.in) == s.unknown {
		return verdict{NotJudged, "", "no applied change of the members is known"}
	}
	return verdict{result: Consistent}
}

// judgeSetReading judges r, a reading of a present set: a first reading
// with wrong members returns a confirmation task; a confirmation judges
// only the members wrong in the first reading. Such a member is
// inconsistent when it is still wrong and neither the set, nor the
// truth, nor the daemon's latest change of it moved between the two
// readings; the set moving for other members does not matter. One that
// moved is not judged; one now right is consistent.
func (o *Observer) judgeSetReading(t *task, r *reading) (verdict, *task) {
	s := r.set
	if t.first == nil {
		v := s.verdict(s.wrong)
		if v.result == Inconsistent {
			return v, &task{due: o.deps.Now().Add(o.cfg.ConfirmAfter), c: t.c, window: t.window, first: r}
		}
		return v, nil
	}
	f := t.first.set
	var confirmed, moved []string
	for _, m := range f.wrong {
		if s.busy[m] {
			moved = append(moved, m)
			continue
		}
		if s.in[m] == s.want[m] {
			continue
		}
		if s.in[m] == f.in[m] && s.want[m] == f.want[m] && s.seq[m] == f.seq[m] {
			confirmed = append(confirmed, m)
		} else {
			moved = append(moved, m)
		}
	}
	switch {
	case len(confirmed) > 0:
		return s.verdict(confirmed), nil
	case len(moved) > 0:
		return verdict{NotJudged, "", "the members in question moved while they were confirmed: " + strings.Join(moved, " ")}, nil
	}
	return verdict{result: Consistent}, nil
}

// itemVerdict is the judgement of one item a change touched.
type itemVerdict struct {
	key string
	verdict
}

// run performs the check t and records it.
func (o *Observer) run(t *task) {
	c := t.c
	switch c.kind {
	case rules.OpBump:
		o.done(t, o.checkBump(t))
	case rules.OpSetAdd, rules.OpSetRemove, rules.OpSetAppend, rules.OpCount, rules.OpRecount:
		if t.first != nil && t.first.at != nil {
			v, next := o.judgeAt(t, t.first)
			if next != nil {
				o.push(next)
				return
			}
			o.done(t, []itemVerdict{{c.key, v}})
			return
		}
		v, confirm := o.checkData(t)
		if confirm != nil {
			o.push(confirm)
			return
		}
		o.done(t, []itemVerdict{{c.key, v}})
	}
}

// checkBump judges a bumped namespace and its evidence master.
func (o *Observer) checkBump(t *task) []itemVerdict {
	c := t.c
	keys := []string{c.key}
	if c.masterKey != "" {
		keys = append(keys, c.masterKey)
	}
	items, v, ok := o.read(keys)
	if !ok {
		out := make([]itemVerdict, len(keys))
		for i, k := range keys {
			out[i] = itemVerdict{k, v}
		}
		return out
	}
	out := []itemVerdict{{c.key, judgeVersion(c.before, items[c.key], c.beforeAt, o.cfg.ClockSkew, o.cfg.Detached)}}
	if c.masterKey != "" {
		out = append(out, itemVerdict{c.masterKey, judgeMaster(c.masterBefore, items[c.masterKey], c.bit, c.rule.Evidence.Bits, c.beforeAt, o.cfg.ClockSkew)})
	}
	return out
}

// read reads keys within the memcached budget; on failure it returns the
// not-judged verdict to record.
func (o *Observer) read(keys []string) (map[string]Item, verdict, bool) {
	if !o.mcBudget.take(float64(len(keys)), o.deps.Now()) {
		o.m.budgetSpent.WithLabelValues("memcached").Inc()
		return nil, verdict{NotJudged, "", "memcached read budget spent"}, false
	}
	items, err := o.get(keys)
	if err != nil {
		return nil, verdict{NotJudged, "", "read failed: " + err.Error()}, false
	}
	return items, verdict{}, true
}

// checkData judges a set or counter against MySQL (or a set without a
// load query against the latest change the daemon applied to each member
// the change named). A mismatch seen for the first time returns a
// confirmation task instead of a verdict.
func (o *Observer) checkData(t *task) (verdict, *task) {
	c := t.c
	isSet := c.kind != rules.OpCount && c.kind != rules.OpRecount
	keys := []string{c.key}
	if c.rule.Generation != "" {
		keys = append(keys, c.rule.Generation)
	}
	items, v, ok := o.read(keys)
	if !ok {
		return v, nil
	}
	r := reading{item: items[c.key]}
	if !r.item.Present || !currentGeneration(c, isSet, r.item, items) {
		// Missing to readers: absent, or of a generation that is not
		// (or no longer) its table's (docs/formats.md, "Generations").
		return verdict{result: Missing}, nil
	}
	if isSet && c.rule.Query == "" {
		// No query: each member the change named is judged against the
		// latest change the daemon applied to it (watch.go).
		named := sortedKeys(c.members)
		r.set = o.readSet(c.key, r.item, named, nil)
		return o.judgeSetReading(t, &r)
	}
	if c.rule.Query == "" || o.deps.Truth == nil {
		return verdict{NotJudged, "", "no query gives the truth"}, nil
	}
	if !o.sqlBudget.take(1, o.deps.Now()) {
		o.m.budgetSpent.WithLabelValues("mysql").Inc()
		return verdict{NotJudged, "", "MySQL query budget spent"}, nil
	}
	o.m.sqlQueries.Inc()
	if isSet {
		return o.judgeSetByQuery(t, &r)
	}
	return o.judgeCounterByQuery(t, &r)
}

// judgeSetByQuery judges the set read in r against the members its rule's
// load query returns now: the members in question are those the set and
// the query disagree on (or, confirming, those of the first reading).
func (o *Observer) judgeSetByQuery(t *task, r *reading) (verdict, *task) {
	c := t.c
	loaded, err := o.deps.Truth.LoadMembers(o.ctx, c.rule.Query, c.args)
	for _, m := range loaded {
		r.members = append(r.members, rules.Escape(m))
	}
	sort.Strings(r.members)
	r.members = slices.Compact(r.members)
	if err != nil {
		return verdict{NotJudged, "", "query failed: " + err.Error()}, nil
	}
	v := judgeSetAll(r.item, r.members)
	if v.result != Inconsistent {
		return v, nil
	}
	var question []string
	if t.first != nil && t.first.set != nil {
		question = t.first.set.wrong
	} else {
		extra, lacking := diff(itemformat.DecodeSet(r.item.Value).Members, r.members)
		question = append(extra, lacking...)
	}
	r.set = o.readSet(c.key, r.item, question, toSet(r.members))
	return o.judgeSetReading(t, r)
}

// judgeCounterByQuery judges the counter read in r against its rule's
// count: at the counter's position when a snapshot gives one (countAt),
// else now. A first mismatch returns a confirmation task; it is confirmed
// only when neither side moved between the two readings (otherwise a
// change in flight may explain the difference).
func (o *Observer) judgeCounterByQuery(t *task, r *reading) (verdict, *task) {
	c := t.c
	if snap := o.snapshotCounter(c); snap != nil {
		v, confirm, handled := o.countAt(o.ctx, t, r, snap)
		if handled {
			return v, confirm
		}
		// No position: the confirm step below, with this count.
	} else {
		var err error
		if r.count, err = o.deps.Truth.Count(o.ctx, c.rule.Query, c.args); err != nil {
			return verdict{NotJudged, "", "query failed: " + err.Error()}, nil
		}
	}
	v := judgeCounter(r.item, r.count)
	if v.result != Inconsistent {
		return v, nil
	}
	if t.first == nil {
		return v, &task{due: o.deps.Now().Add(o.cfg.ConfirmAfter), c: c, window: t.window, first: r}
	}
	f := t.first
	if !bytes.Equal(f.item.Value, r.item.Value) || f.count != r.count {
		return verdict{NotJudged, v.expected, v.seen + " (moved while it was confirmed)"}, nil
	}
	return v, nil
}

// currentGeneration reports whether the set or counter read as it (at
// c.key) belongs to its table's current generation, read beside it in
// items: a set carries it as its first token, a counter's key ends with
// '@' and it (a counter whose key was hashed is taken as current). Rules
// without a generation always are.
func currentGeneration(c *change, isSet bool, it Item, items map[string]Item) bool {
	if c.rule.Generation == "" {
		return true
	}
	g := items[c.rule.Generation]
	if !g.Present {
		return false
	}
	gen, ok := itemformat.ParseGeneration(g.Value)
	if !ok {
		return false
	}
	if isSet {
		return itemformat.DecodeSet(it.Value).ValidAt(gen)
	}
	at := "@" + strconv.FormatUint(gen, 10)
	hashed := len(c.key) == rules.MaxKeyLen-17 && c.key[200] == '#'
	return hashed || strings.HasSuffix(c.key, at)
}
