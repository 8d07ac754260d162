package rules

import (
	"bytes"
	"fmt"
	"slices"
)

// PlanStats counts what Plan did with one event.
type PlanStats struct {
	// Rules is the number of rules whose table and `on` list matched.
	Rules int
	// NullKeys counts row images that produced no key or set member
	// because a placeholder column was NULL (no op is planned for them).
	NullKeys int
	// Unchanged counts bump rules with `columns` that skipped an update
	// because none of those columns changed.
	Unchanged int
}

// Add adds o's counts to s.
func (s *PlanStats) Add(o PlanStats) {
	s.Rules += o.Rules
	s.NullKeys += o.NullKeys
	s.Unchanged += o.Unchanged
}

// EventError reports an event that cannot be planned: a row image a rule
// needs is missing, a column a rule needs is missing from an image, or a
// key renders empty. Such an event is a poison message.
type EventError struct {
	// Rule is the name of the rule that could not be applied.
	Rule string
	// Image is "before" or "after".
	Image string
	// Column is the missing column; "" when Reason says what is wrong.
	Column string
	// Reason describes a problem other than a missing column.
	Reason string
}

func (e *EventError) Error() string {
	if e.Column != "" {
		return fmt.Sprintf("rule %q: column %q missing from the %s image", e.Rule, e.Column, e.Image)
	}
	return fmt.Sprintf("rule %q: %s image: %s", e.Rule, e.Image, e.Reason)
}

const (
	imageBefore = "before"
	imageAfter  = "after"
)

// Plan appends to dst the cache operations that ev produces under the rule
// set, in rule order and, within a rule, before-image ops before
// after-image ops; it returns the extended slice and what it skipped.
//
// For each rule that matches the event's table and lists its operation in
// `on` (truncate events: the bump rules listing truncate, and a bump of
// the generation key of the set and count rules, see GenerationKeys):
//
//   - a rule considers a row image only when it exists and `when` holds on
//     it; a NULL placeholder column gives no key (counted in NullKeys);
//   - bump: key(before) and key(after), once if equal; with `columns`, an
//     update whose listed columns all kept their values bumps nothing;
//   - set: set_remove of the before membership (key, member) and set_add
//     of the after one, nothing when they are equal;
//   - count: -1 at key(before) and +1 at key(after), nothing when the keys
//     are equal;
//   - an update without a before image bumps key(after) whatever `when`
//     says (the old row is unknown), set_adds the after membership when
//     `when` holds and set_removes it otherwise, and recounts
//     key(after).
//
// Op.Args holds the values of the rule's args columns taken from the image
// that produced the op's key, when the rule has a load or recount query;
// Op.Source is ev.Source.
//
// A row image the operation needs that is absent, or a column a key,
// member, args or columns list needs that the image lacks, is an
// *EventError; dst is then returned without any op of ev. Predicates read
// a missing column as null instead.
//
// ev must not be nil. Plan is safe for concurrent use. The ops share no
// memory with ev's rows: their strings and Args (values included) are
// copied into blocks shared with other calls (see StringArena), so most
// calls allocate nothing.
func (rs *RuleSet) Plan(dst []Op, ev *Event) ([]Op, PlanStats, error) {
	cands := rs.byTable[ev.Table]
	if len(cands) == 0 {
		return dst, PlanStats{}, nil
	}
	sc := rs.scratch.Get().(*planScratch)
	sc.buf, sc.spans, sc.args = sc.buf[:0], sc.spans[:0], sc.args[:0]
	p := planner{sc: sc, ev: ev, dst: dst, base: len(dst)}
	var err error
	for _, r := range cands {
		if (r.Database != "" && r.Database != ev.Database) || !r.Handles(ev.Operation) {
			continue
		}
		p.st.Rules++
		if err = p.rule(r); err != nil {
			break
		}
	}
	if err != nil {
		clear(p.dst[p.base:])
		dst = p.dst[:p.base]
	} else {
		dst = p.finish()
		if ev.Operation == Truncate {
			// A truncate empties every set and zeroes every counter
			// of the table: their generation moves on.
			dst = rs.appendTruncateGenerations(dst, cands, ev)
		}
	}
	if cap(sc.buf) > 64<<10 {
		sc.buf = nil // do not keep a huge event's buffer around
	}
	clear(sc.args) // drop references to the event's strings
	rs.scratch.Put(sc)
	return dst, p.st, err
}

// planScratch is the reusable working memory of one Plan call.
type planScratch struct {
	buf   []byte // rendered keys and members of the event's ops
	spans []opSpan
	args  []Value
	// strs holds the ops' keys and members, and values the copies of
	// their Args, across the Plan calls that take this scratch.
	strs   StringArena
	values []Value
}

// valueBlock is how many Values planScratch.values allocates at a time.
const valueBlock = 256

type span struct{ start, end int }

type opSpan struct {
	key, member span
	args        span
	hasArgs     bool
}

type planner struct {
	sc   *planScratch
	ev   *Event
	st   PlanStats
	dst  []Op
	base int
}

func (p *planner) rule(r *Rule) error {
	ev := p.ev
	switch ev.Operation {
	case Truncate:
		k, _, err := p.key(r, nil, "")
		if err != nil {
			return err
		}
		p.bump(r, k, nil)
		return nil
	case Insert, Read:
		if ev.After == nil {
			return &EventError{Rule: r.Name, Image: imageAfter, Reason: "missing; an " + ev.Operation.String() + " needs it"}
		}
		return p.images(r, nil, ev.After)
	case Delete:
		if ev.Before == nil {
			return &EventError{Rule: r.Name, Image: imageBefore, Reason: "missing; a delete needs it"}
		}
		return p.images(r, ev.Before, nil)
	case Update:
		if ev.After == nil {
			return &EventError{Rule: r.Name, Image: imageAfter, Reason: "missing; an update needs it"}
		}
		if ev.Before == nil {
			return p.updateWithoutBefore(r, ev.After)
		}
		return p.images(r, ev.Before, ev.After)
	}
	return nil
}

// images plans a rule for the before image b and after image a (either
// may be nil).
func (p *planner) images(r *Rule, b, a Row) error {
	if r.Kind == BumpRule && b != nil && a != nil && len(r.Columns) > 0 {
		changed, err := columnsChanged(r, b, a)
		if err != nil {
			return err
		}
		if !changed {
			p.st.Unchanged++
			return nil
		}
	}
	var kb, ka, mb, ma span
	var hb, ha bool
	var err error
	if b != nil && r.pred.holds(b) {
		if kb, mb, hb, err = p.identity(r, b, imageBefore); err != nil {
			return err
		}
	}
	if a != nil && r.pred.holds(a) {
		if ka, ma, ha, err = p.identity(r, a, imageAfter); err != nil {
			return err
		}
	}
	same := hb && ha && p.equal(kb, ka) && (r.Kind != SetRule || p.equal(mb, ma))
	switch r.Kind {
	case BumpRule:
		// Bump rules have no query, so emit takes no args and cannot fail.
		if hb {
			p.bump(r, kb, b)
		}
		if ha && !same {
			p.bump(r, ka, a)
		}
	case SetRule:
		if same {
			return nil
		}
		if hb {
			if err := p.emit(OpSetRemove, r, kb, mb, 0, b, imageBefore); err != nil {
				return err
			}
		}
		if ha {
			return p.emit(OpSetAdd, r, ka, ma, 0, a, imageAfter)
		}
	case CountRule:
		if same {
			return nil
		}
		if hb {
			if err := p.emit(OpCount, r, kb, span{}, -1, b, imageBefore); err != nil {
				return err
			}
		}
		if ha {
			return p.emit(OpCount, r, ka, span{}, +1, a, imageAfter)
		}
	}
	return nil
}

// updateWithoutBefore plans an update whose before image is unknown.
func (p *planner) updateWithoutBefore(r *Rule, a Row) error {
	k, m, ok, err := p.identity(r, a, imageAfter)
	if err != nil || !ok {
		return err
	}
	switch r.Kind {
	case BumpRule:
		p.bump(r, k, a)
		return nil
	case SetRule:
		if r.pred.holds(a) {
			return p.emit(OpSetAdd, r, k, m, 0, a, imageAfter)
		}
		return p.emit(OpSetRemove, r, k, m, 0, a, imageAfter)
	case CountRule:
		return p.emit(OpRecount, r, k, span{}, 0, a, imageAfter)
	}
	return nil
}

// identity renders an image's key and, for set rules, its member. ok is
// false (nothing rendered, NullKeys counted) when a placeholder is NULL.
func (p *planner) identity(r *Rule, row Row, image string) (key, member span, ok bool, err error) {
	key, null, err := p.key(r, row, image)
	if err != nil || null {
		return span{}, span{}, false, err
	}
	if r.Kind == SetRule {
		member, null, err = p.render(r, r.Member, "", row, image)
		if err != nil || null {
			p.sc.buf = p.sc.buf[:key.start]
			return span{}, span{}, false, err
		}
	}
	return key, member, true, nil
}

// key renders prefix + key template for row and turns it into a legal
// memcached key. The key of a rule with copies is left as rendered: bump
// makes the copies' keys of it.
func (p *planner) key(r *Rule, row Row, image string) (span, bool, error) {
	s, null, err := p.render(r, r.Key, r.Prefix, row, image)
	if err != nil || null {
		return s, null, err
	}
	if s.end == s.start {
		return s, false, &EventError{Rule: r.Name, Image: image, Reason: "the key renders empty"}
	}
	if r.Copies > 0 {
		return s, false, nil
	}
	return p.finishKey(s), false, nil
}

// finishKey applies FinishKey to the key at s, which must end the scratch
// buffer.
func (p *planner) finishKey(s span) span {
	if s.end-s.start > MaxKeyLen {
		p.sc.buf = appendHashed(p.sc.buf[:s.start], p.sc.buf[s.start:s.end])
		s.end = len(p.sc.buf)
	}
	return s
}

// bump emits the bumps of the namespace key k of row (nil for a
// truncate): one op, or one per copy of a rule with copies; a rule with
// evidence carries the entity's bit.
func (p *planner) bump(r *Rule, k span, row Row) {
	if r.Copies == 0 {
		// Bump rules have no query, so emit takes no args and cannot fail.
		p.emit(OpBump, r, k, span{}, 0, nil, "")
		if ev := r.Evidence; ev != nil && row != nil {
			id, _ := row.Get(ev.Column) // the key rendered, so it is there
			p.dst[len(p.dst)-1].EvidenceBit = EvidenceBit(id.Text, ev.Bits)
		}
		return
	}
	for i := range r.Copies {
		c := span{start: len(p.sc.buf)}
		p.sc.buf = appendCopySuffix(append(p.sc.buf, p.sc.buf[k.start:k.end]...), i)
		c.end = len(p.sc.buf)
		p.emit(OpBump, r, p.finishKey(c), span{}, 0, nil, "")
		// The copy's key in releases before the "%copy" mark (Op.Legacy).
		l := span{start: len(p.sc.buf)}
		p.sc.buf = appendLegacyKey(p.sc.buf, p.sc.buf[k.start:k.end], i)
		l.end = len(p.sc.buf)
		p.emit(OpBump, r, l, span{}, 0, nil, "")
		p.dst[len(p.dst)-1].Legacy = true
	}
}

// legacyOps appends, for each op planned since base on a hashed long key
// (of a rule without copies: bump makes the copies' own), an op on the key
// releases before the "%#" mark used for it, the same bytes with '#' in
// place of the mark: a bump for a bump, a delete for a set or counter
// change (Op.Legacy).
func (p *planner) legacyOps() {
	n := len(p.dst) - p.base
	for i := range n {
		k := p.sc.spans[i].key
		op := p.dst[p.base+i]
		if op.Legacy || op.Rule.Copies > 0 || !isHashed(p.sc.buf[k.start:k.end]) {
			continue
		}
		l := span{start: len(p.sc.buf)}
		p.sc.buf = append(p.sc.buf, p.sc.buf[k.start:k.start+hashedKeyHead]...)
		p.sc.buf = append(p.sc.buf, legacyMark)
		p.sc.buf = append(p.sc.buf, p.sc.buf[k.start+hashedKeyHead+len(hashMark):k.end]...)
		l.end = len(p.sc.buf)
		kind := OpSetDelete
		if op.Kind == OpBump {
			kind = OpBump
		}
		p.sc.spans = append(p.sc.spans, opSpan{key: l})
		p.dst = append(p.dst, Op{Kind: kind, Rule: op.Rule, Source: op.Source, EvidenceBit: op.EvidenceBit, Legacy: true})
	}
}

// render appends prefix and the escaped rendering of t to the scratch
// buffer. null is true (and nothing is kept) when a placeholder column is
// NULL; a missing column is an *EventError.
func (p *planner) render(r *Rule, t *Template, prefix string, row Row, image string) (s span, null bool, err error) {
	buf := p.sc.buf
	s.start = len(buf)
	buf = append(buf, prefix...)
	for i := range t.parts {
		part := &t.parts[i]
		if part.column == "" {
			buf = append(buf, part.literal...)
			continue
		}
		v, found := row.Get(part.column)
		if !found {
			p.sc.buf = buf[:s.start]
			return span{}, false, &EventError{Rule: r.Name, Image: image, Column: part.column}
		}
		if v.IsNull() {
			null = true
			continue
		}
		if len(v.Text) > largeValue {
			buf = slices.Grow(buf, len(v.Text)) // see largeValue
		}
		buf = AppendEscaped(buf, v.Text)
	}
	if null {
		p.st.NullKeys++
		p.sc.buf = buf[:s.start]
		return span{}, true, nil
	}
	p.sc.buf = buf
	s.end = len(buf)
	return s, false, nil
}

func (p *planner) equal(a, b span) bool {
	buf := p.sc.buf
	return bytes.Equal(buf[a.start:a.end], buf[b.start:b.end])
}

// emit appends an op; its strings are filled in by finish. When the rule
// has a query, the args are taken from argRow.
func (p *planner) emit(kind OpKind, r *Rule, key, member span, delta int64, argRow Row, image string) error {
	sp := opSpan{key: key, member: member}
	if r.Query != "" && argRow != nil {
		sp.hasArgs = true
		sp.args.start = len(p.sc.args)
		for _, c := range r.Args {
			v, ok := argRow.Get(c)
			if !ok {
				return &EventError{Rule: r.Name, Image: image, Column: c}
			}
			p.sc.args = append(p.sc.args, v)
		}
		sp.args.end = len(p.sc.args)
	}
	p.sc.spans = append(p.sc.spans, sp)
	p.dst = append(p.dst, Op{Kind: kind, Rule: r, Delta: delta, Source: p.ev.Source})
	return nil
}

// finish converts the scratch buffer to one string and points the new
// ops' keys, members and args into it.
func (p *planner) finish() []Op {
	if len(p.sc.spans) == 0 {
		return p.dst
	}
	p.legacyOps()
	sc := p.sc
	s := sc.strs.Copy(sc.buf)
	var args []Value
	if n := len(sc.args); n > 0 {
		// Slices of a shared block, as the strings: a block is written
		// once and never handed out again.
		if cap(sc.values)-len(sc.values) < n {
			sc.values = make([]Value, 0, max(valueBlock, n))
		}
		start := len(sc.values)
		for _, v := range sc.args {
			// Copied, so that a kept op holds on to no event's memory (a
			// message's value, or the fetch response holding it).
			v.Text = sc.strs.CopyString(v.Text)
			sc.values = append(sc.values, v)
		}
		args = sc.values[start:len(sc.values):len(sc.values)]
	}
	ops := p.dst[p.base:]
	for i := range ops {
		sp := &sc.spans[i]
		ops[i].Key = s[sp.key.start:sp.key.end]
		ops[i].Member = s[sp.member.start:sp.member.end]
		if sp.hasArgs {
			ops[i].Args = args[sp.args.start:sp.args.end:sp.args.end]
		}
	}
	return p.dst
}

// columnsChanged reports whether any of a bump rule's columns differs
// between the before image b and the after image a, counting the key's
// placeholder columns and the truth of `when` as listed.
func columnsChanged(r *Rule, b, a Row) (bool, error) {
	for _, c := range r.Columns {
		vb, ok := b.Get(c)
		if !ok {
			return false, &EventError{Rule: r.Name, Image: imageBefore, Column: c}
		}
		va, ok := a.Get(c)
		if !ok {
			return false, &EventError{Rule: r.Name, Image: imageAfter, Column: c}
		}
		if !sameValue(vb, va) {
			return true, nil
		}
	}
	// The columns that decide which keys an update touches always count
	// as listed: a row that moves to another key, or enters or leaves the
	// rule's `when`, must bump even if no listed column changed, else the
	// old key would keep serving the moved row.
	for _, c := range r.Key.Columns() {
		vb, okb := b.Get(c)
		va, oka := a.Get(c)
		if okb && oka && !sameValue(vb, va) {
			return true, nil
		}
	}
	if r.pred.holds(b) != r.pred.holds(a) {
		return true, nil
	}
	return false, nil
}
