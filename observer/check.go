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
// load query against the row's image). A mismatch with MySQL seen for
// the first time returns a confirmation task instead of a verdict.
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
		// The row's image is the truth: no query, nothing moves but the
		// item itself.
		v = judgeSetMembers(r.item, c.members)
		if v.result == Inconsistent && t.first == nil {
			return v, &task{due: o.deps.Now().Add(o.cfg.ConfirmAfter), c: c, window: t.window, first: &r}
		}
		if t.first != nil && v.result == Inconsistent && !bytes.Equal(t.first.item.Value, r.item.Value) {
			return verdict{NotJudged, v.expected, v.seen + " (the set changed while it was confirmed)"}, nil
		}
		return v, nil
	}
	if c.rule.Query == "" || o.deps.Truth == nil {
		return verdict{NotJudged, "", "no query gives the truth"}, nil
	}
	if !o.sqlBudget.take(1, o.deps.Now()) {
		o.m.budgetSpent.WithLabelValues("mysql").Inc()
		return verdict{NotJudged, "", "MySQL query budget spent"}, nil
	}
	o.m.sqlQueries.Inc()
	var err error
	if isSet {
		var loaded []string
		loaded, err = o.deps.Truth.LoadMembers(o.ctx, c.rule.Query, c.args)
		for _, m := range loaded {
			r.members = append(r.members, rules.Escape(m))
		}
		sort.Strings(r.members)
		r.members = slices.Compact(r.members)
	} else if snap := o.snapshotCounter(c); snap != nil {
		v, confirm, handled := o.countAt(o.ctx, t, &r, snap)
		if handled {
			return v, confirm
		}
		// No position: the confirm step below, with this count.
	} else {
		r.count, err = o.deps.Truth.Count(o.ctx, c.rule.Query, c.args)
	}
	if err != nil {
		return verdict{NotJudged, "", "query failed: " + err.Error()}, nil
	}
	if isSet {
		v = judgeSetAll(r.item, r.members)
	} else {
		v = judgeCounter(r.item, r.count)
	}
	if v.result != Inconsistent {
		return v, nil
	}
	if t.first == nil {
		return v, &task{due: o.deps.Now().Add(o.cfg.ConfirmAfter), c: c, window: t.window, first: &r}
	}
	// Confirmed only when neither side moved between the two readings:
	// otherwise a change in flight may explain the difference.
	f := t.first
	if !bytes.Equal(f.item.Value, r.item.Value) || f.count != r.count || !slices.Equal(f.members, r.members) {
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
