package inspect

import (
	"context"
	"fmt"
	"strconv"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/verify"
)

// Bounds of what a report shows of an item.
const (
	// MaxRawBytes is how many bytes of an item's value a report shows
	// (escaped); Item.Size gives the whole size.
	MaxRawBytes = 256
	// MaxMembers is how many members of a set a report lists.
	MaxMembers = 100
)

// Item is what memcached holds at one key, and what it means.
type Item struct {
	// Role says what the item is to the entity: "namespace",
	// "namespace copy N", "evidence master", "set", "counter", "fence",
	// "generation", with " (earlier release)" for the keys releases
	// before the "%#" and "%copy" marks used.
	Role   string `json:"role"`
	Key    string `json:"key"`
	Server string `json:"server"`
	// Present reports whether the item exists.
	Present bool `json:"present"`
	// Size is the value's size in bytes; Flags its client flags.
	Size  int    `json:"size,omitempty"`
	Flags uint32 `json:"flags,omitempty"`
	// Raw is the value's first MaxRawBytes bytes, Go-quoted.
	Raw string `json:"raw,omitempty"`
	// Meaning decodes the value (or says what its absence means).
	Meaning string `json:"meaning"`
	// Version is a namespace's, master's or generation's version.
	Version *uint64 `json:"version,omitempty"`
	// Members are a set's members (escaped, compacted: removed and
	// repeated tokens dropped), at most MaxMembers.
	Members []string `json:"members,omitempty"`
	// Count is a counter's value.
	Count *int64 `json:"count,omitempty"`
}

// Truth is what MySQL says of a set or counter now.
type Truth struct {
	// Query is the rule's load or recount query; Args the values bound
	// to its placeholders, in order.
	Query string   `json:"query"`
	Args  []string `json:"args"`
	// Result is the query's answer as Comparison renders it: a count,
	// or the set's escaped members in braces. "" when it failed.
	Result string `json:"result,omitempty"`
	// Agrees says whether memcached agrees: true when the item is
	// missing (readers load it) or equal to Result.
	Agrees bool `json:"agrees"`
	// Note says how the item compares, or why the query failed.
	Note string `json:"note"`
}

// PoolReport is one pool's view of an entity.
type PoolReport struct {
	Pool  string `json:"pool"`
	Items []Item `json:"items"`
	// MySQL is nil for bump rules, rules without a query and pools
	// without a DSN.
	MySQL *Truth `json:"mysql,omitempty"`
	// Error says why the pool could not be read; "" when it could.
	Error string `json:"error,omitempty"`
}

// Report is `cachewarden key`'s answer for one entity.
type Report struct {
	Rule   string         `json:"rule"`
	Kind   string         `json:"kind"`
	Entity []rules.Column `json:"-"`
	// Values are the entity's column values, in the rule's order.
	Values map[string]string `json:"entity"`
	Pools  []PoolReport      `json:"pools"`
}

// Failed reports whether any pool could not be read or queried.
func (r *Report) Failed() bool {
	for _, p := range r.Pools {
		if p.Error != "" {
			return true
		}
	}
	return false
}

// Key reads the items of the entity of the rule named ruleName given by
// "column=value" args in every pool: the namespace (its copies, its
// evidence master) of a bump rule; the set or counter (with its fence)
// and its table's generation of a set or count rule, with what the rule's
// query says in MySQL now. A pool that cannot be read is reported in its
// PoolReport.Error; a rule or entity that is wrong is an error.
func Key(ctx context.Context, pools []*Pool, ruleName string, args []string) (*Report, error) {
	rep := &Report{Rule: ruleName}
	for _, p := range pools {
		r, row, ops, err := p.entity(ruleName, args)
		if err != nil {
			return nil, err
		}
		rep.Kind = r.Kind.String()
		if rep.Values == nil {
			rep.Entity, rep.Values = row, make(map[string]string, len(row))
			for _, c := range row {
				rep.Values[c.Name] = c.Value.Text
			}
		}
		pr := PoolReport{Pool: p.Name}
		if err := p.inspect(ctx, r, ops, &pr); err != nil {
			pr.Error = err.Error()
		}
		rep.Pools = append(rep.Pools, pr)
	}
	return rep, nil
}

// inspect fills pr with the items of the entity whose ops are ops.
func (p *Pool) inspect(ctx context.Context, r *rules.Rule, ops []rules.Op, pr *PoolReport) error {
	var gen uint64
	genOK := false
	if r.Kind != rules.BumpRule && r.Generation != "" {
		var err error
		if gen, genOK, err = p.reportGeneration(r, pr); err != nil {
			return err
		}
		if !genOK {
			return p.truth(ctx, r, &ops[0], nil, pr)
		}
	}
	wants := wantedItems(r, ops, gen, genOK)
	keys := make([]string, len(wants))
	for i, w := range wants {
		keys[i] = w.key
	}
	items, err := p.Cache.GetMulti(keys)
	if err != nil {
		return fmt.Errorf("pool %s: read %d keys: %w", p.Name, len(keys), err)
	}
	main := p.describeItems(r, wants, items, gen, genOK, pr)
	return p.truth(ctx, r, &ops[0], main, pr)
}

// reportGeneration reads the generation item of r's table into pr and
// returns its value; ok is false when it is missing or not a generation.
func (p *Pool) reportGeneration(r *rules.Rule, pr *PoolReport) (gen uint64, ok bool, err error) {
	g, item, ok, err := p.generation(r)
	if err != nil {
		return 0, false, err
	}
	it := p.item("generation", r.Generation, item)
	switch {
	case !it.Present:
		it.Meaning = "missing: no set or counter of the table is valid; the next writer creates it"
	case ok:
		it.Version, it.Meaning = &g, fmt.Sprintf("generation %d", g)
	default:
		it.Meaning = "not a generation: no set or counter of the table is valid; the daemon replaces it"
	}
	pr.Items = append(pr.Items, it)
	return g, ok, nil
}

// wantedItem is an item inspect reads: its role in the report, its key
// and the op that names it (nil for a fence).
type wantedItem struct {
	role string
	key  string
	op   *rules.Op
}

// wantedItems lists the items of ops to read: each op's key (a counter's
// under generation gen when genOK), each counter's fence, and the
// evidence master of r.
func wantedItems(r *rules.Rule, ops []rules.Op, gen uint64, genOK bool) []wantedItem {
	var wants []wantedItem
	copyN := 0
	for i := range ops {
		op := &ops[i]
		role := roleOf(r, op, copyN)
		if op.Kind == rules.OpBump && r.Copies > 0 && !op.Legacy {
			copyN++
		}
		key := op.Key
		if r.Kind == rules.CountRule && !op.Legacy && genOK {
			key = itemformat.CounterKey(key, gen)
		}
		wants = append(wants, wantedItem{role, key, op})
		if r.Kind == rules.CountRule && !op.Legacy {
			wants = append(wants, wantedItem{"fence", counters.FenceKey(key), nil})
		}
	}
	if ev := r.Evidence; ev != nil {
		wants = append(wants, wantedItem{"evidence master", ev.MasterKey, &ops[0]})
	}
	return wants
}

// describeItems adds each wanted item, as read in items, to pr with what
// it means, and returns the current set or counter item (nil when none),
// which truth compares with MySQL.
func (p *Pool) describeItems(r *rules.Rule, wants []wantedItem, items map[string]*memcache.Item, gen uint64, genOK bool, pr *PoolReport) *memcache.Item {
	var main *memcache.Item
	var fenceID uint32
	for _, w := range wants {
		it := p.item(w.role, w.key, items[w.key])
		v := items[w.key]
		switch {
		case w.role == "evidence master":
			describeMaster(&it, v, r.Evidence, w.op.EvidenceBit)
		case w.role == "fence":
			describeFence(&it, v, fenceID)
		case r.Kind == rules.BumpRule:
			describeNamespace(&it, v)
		case r.Kind == rules.SetRule:
			if describeSet(&it, v, gen, genOK) && !w.op.Legacy {
				main = v
			}
		case r.Kind == rules.CountRule:
			describeCounter(&it, v)
			if !w.op.Legacy && it.Present {
				main, fenceID = v, v.Flags
			}
		}
		pr.Items = append(pr.Items, it)
	}
	return main
}

// roleOf names the item of op (the n-th copy of a rule with copies).
func roleOf(r *rules.Rule, op *rules.Op, n int) string {
	role := map[rules.RuleKind]string{rules.BumpRule: "namespace", rules.SetRule: "set", rules.CountRule: "counter"}[r.Kind]
	if r.Kind == rules.BumpRule && r.Copies > 0 {
		if op.Legacy {
			n-- // the legacy key follows its copy
		}
		role += " copy " + strconv.Itoa(n)
	}
	if op.Legacy {
		role += " (earlier release)"
	}
	return role
}

// item starts the Item of key from what memcached returned (nil: the
// item is missing).
func (p *Pool) item(role, key string, v *memcache.Item) Item {
	it := Item{Role: role, Key: key, Server: p.server(key)}
	if v == nil {
		return it
	}
	it.Present, it.Size, it.Flags = true, len(v.Value), v.Flags
	raw := v.Value
	if len(raw) > MaxRawBytes {
		raw = raw[:MaxRawBytes]
	}
	it.Raw = strconv.Quote(string(raw))
	if len(v.Value) > MaxRawBytes {
		it.Raw += fmt.Sprintf(" (first %d of %d bytes)", MaxRawBytes, len(v.Value))
	}
	return it
}

// parseItem parses the value of item v with parse; when v is missing or
// parse rejects its value, it sets it.Meaning to missing or bad and
// returns false.
func parseItem[T any](it *Item, v *memcache.Item, parse func([]byte) (T, bool), missing, bad string) (T, bool) {
	var zero T
	if v == nil {
		it.Meaning = missing
		return zero, false
	}
	x, ok := parse(v.Value)
	if !ok {
		it.Meaning = bad
		return zero, false
	}
	return x, true
}

func describeNamespace(it *Item, v *memcache.Item) {
	ver, ok := parseItem(it, v, itemformat.ParseVersion,
		"missing: readers create it and recompute what hangs off it",
		"not a namespace version: the next bump or reader replaces it")
	if !ok {
		return
	}
	it.Version, it.Meaning = &ver, fmt.Sprintf("namespace version %d", ver)
}

func describeMaster(it *Item, v *memcache.Item, ev *rules.Evidence, bit int) {
	if v == nil {
		it.Meaning = "missing: readers create it and recompute what hangs off it"
		return
	}
	m, err := itemformat.DecodeMaster(v.Value, ev.Bits)
	if err != nil {
		it.Meaning = "not a master item: " + err.Error()
		return
	}
	state, use := "clear", "readers use the master's version"
	if m.Has(bit) {
		state, use = "set", "readers use the entity's own namespace"
	}
	it.Version = &m.Version
	it.Meaning = fmt.Sprintf("master version %d, %d of %d evidence bits set; the entity's bit %d is %s: %s",
		m.Version, m.Count(), ev.Bits, bit, state, use)
}

// describeSet describes a set item; valid reports whether readers take
// it (present, and of the current generation).
func describeSet(it *Item, v *memcache.Item, gen uint64, genOK bool) (valid bool) {
	if v == nil {
		it.Meaning = "missing: readers will load it"
		return false
	}
	st := itemformat.DecodeSet(v.Value)
	if genOK && !st.ValidAt(gen) {
		at := "no generation token"
		if st.HasGen {
			at = "generation " + strconv.FormatUint(st.Gen, 10)
		}
		it.Meaning = fmt.Sprintf("a set of %s, not the current generation %d: readers take it as missing and load it again", at, gen)
		return false
	}
	it.Members = st.Members[:min(len(st.Members), MaxMembers)]
	it.Meaning = fmt.Sprintf("set of %d members (%d tokens, %d removals)", len(st.Members), st.Tokens, st.Removals)
	if len(st.Members) > MaxMembers {
		it.Meaning += fmt.Sprintf("; the first %d members listed", MaxMembers)
	}
	return true
}

func describeCounter(it *Item, v *memcache.Item) {
	n, ok := parseItem(it, v, itemformat.ParseCount,
		"missing: readers will recount it",
		"not a count: the daemon recounts it at its next change; readers recount")
	if !ok {
		return
	}
	it.Count = &n
	switch f := v.Flags & itemformat.CounterFlagsMask; {
	case v.Flags == itemformat.ReaderCountFlags:
		it.Meaning = fmt.Sprintf("count %d, recounted by a reader without a fence", n)
	case f == 0:
		it.Meaning = fmt.Sprintf("count %d, stored without a fence", n)
	default:
		it.Meaning = fmt.Sprintf("count %d, recounted at fence id %d", n, v.Flags)
	}
}

func describeFence(it *Item, v *memcache.Item, counterFlags uint32) {
	if v == nil {
		it.Meaning = "missing: the counter's next delta is applied unfenced, or recounts it when the counter names a fence"
		return
	}
	f, err := counters.ParseFence(v.Value)
	if err != nil {
		it.Meaning = "unreadable fence: the counter's next delta recounts it"
		return
	}
	view := counters.FenceView{Counter: counterFlags != 0, Flags: counterFlags, HasFence: true, Fence: f}
	at := f.At.String()
	if f.GTID != "" {
		at += " (GTID " + f.GTID + ")"
	}
	it.Meaning = fmt.Sprintf("fence id %d at %s, server id %d", f.ID, at, f.ServerID)
	switch {
	case view.Consistent():
		it.Meaning += ": the counter is that recount plus the deltas after it"
	case counterFlags == 0:
		it.Meaning += ": the counter is missing or was not stored at a fence"
	default:
		it.Meaning += ": not the counter's fence (a recount in progress, or an older one)"
	}
}

// truth runs r's query for the entity and compares it with main, the
// entity's valid set or counter (nil when missing).
// It does nothing for bump rules, rules without a query and pools
// without MySQL.
func (p *Pool) truth(ctx context.Context, r *rules.Rule, op *rules.Op, main *memcache.Item, pr *PoolReport) error {
	if r.Kind == rules.BumpRule || r.Query == "" || p.Truth == nil {
		return nil
	}
	t := &Truth{Query: r.Query}
	for _, a := range op.Args {
		t.Args = append(t.Args, a.Text)
	}
	pr.MySQL = t
	var value []byte
	if main != nil {
		value = main.Value
	} else if r.Kind == rules.SetRule {
		value = []byte{} // compared as the empty set, reported as missing
	} else {
		value = []byte("0")
	}
	c, err := verify.Compare(ctx, p.Truth, r, op.Args, value)
	if err != nil {
		t.Note = "query failed (below)"
		return fmt.Errorf("pool %s: rule %q: %w", p.Name, r.Name, err)
	}
	t.Result = c.Truth
	switch {
	case main == nil:
		t.Agrees, t.Note = true, "memcached holds no valid item: readers will fill it from this"
	case c.Wrong:
		t.Note = "memcached differs: it holds " + c.Cached
	default:
		t.Agrees, t.Note = true, "memcached agrees"
	}
	return nil
}
