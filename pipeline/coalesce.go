package pipeline

import (
	"slices"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// CoalesceOptions changes how a batch is coalesced.
type CoalesceOptions struct {
	// Recount turns every counter delta into one recount per key. It is
	// set for the first batch after a partition is (re)assigned, whose
	// deltas may already have been applied by the previous owner, and by
	// replay, which re-reads changes whose deltas were applied before.
	Recount bool
	// ResetSets turns every set change into a delete of its set, as
	// replay does: set for the first batch of a partition taken over
	// without a clean handoff, so that a late token of a previous owner
	// (one that stalled between its last check and its send) cannot
	// outlive the set it was appended to (docs/reliability.md).
	ResetSets bool
}

// CoalesceStats counts what one Coalesce call did.
type CoalesceStats struct {
	// In and Out are the numbers of ops before and after coalescing;
	// In-Out memcached operations were saved.
	In, Out int
	// DeltasToRecounts counts counter keys whose deltas became a recount
	// because of CoalesceOptions.Recount.
	DeltasToRecounts int
	// RecountsAbsorbed counts delta ops dropped because their key is
	// recounted in the same batch anyway.
	RecountsAbsorbed int
	// ZeroSums counts counter keys whose deltas summed to zero (no op).
	ZeroSums int
}

// Saved returns how many memcached operations coalescing saved.
func (s CoalesceStats) Saved() int { return s.In - s.Out }

// opClass groups kinds that coalesce with each other. The same key in
// two classes (a misconfiguration) is never merged across them.
type opClass uint8

const (
	classBump opClass = iota
	classSet
	classCounter
	nClasses
)

func classOf(k rules.OpKind) (opClass, bool) {
	switch k {
	case rules.OpBump:
		return classBump, true
	case rules.OpSetAdd, rules.OpSetRemove, rules.OpSetAppend, rules.OpSetDelete:
		return classSet, true
	case rules.OpCount, rules.OpRecount:
		return classCounter, true
	}
	return 0, false
}

// setToken is one token of a coalesced set; dead once a later token for
// the same member supersedes it.
type setToken struct {
	add    bool
	dead   bool
	member string
}

// slot is the coalesced state of one key: the op that first touched it
// (kept for its rule, args and source) plus what the batch accumulated.
type slot struct {
	op      rules.Op
	recount bool
	// deleted: a set_delete of the key; it supersedes the key's tokens.
	deleted  bool
	delta    int64
	deltaOps int
	tokens   []setToken
	// members maps a member to the index of its live token, once the
	// slot has more than tokenScan tokens (fewer are searched in place).
	members map[string]int
}

// tokenScan is how many tokens addToken searches for an earlier token of
// the same member before it indexes them in a map: a set key mostly gets
// one token or a few per batch.
const tokenScan = 8

// newSlot starts a slot for op, reusing the scratch memory of an earlier
// call's slot at the same index, and returns its index.
func (c *Coalescer) newSlot(op *rules.Op) int {
	i := len(c.slots)
	if i < cap(c.slots) {
		c.slots = c.slots[:i+1]
		old := &c.slots[i]
		*old = slot{op: *op, tokens: old.tokens[:0], members: old.members}
	} else {
		c.slots = append(c.slots, slot{op: *op})
	}
	return i
}

// Coalescer merges a batch's planned ops by key (README, "How it works"). Its zero
// value is ready; it keeps scratch memory between calls, so one Coalescer
// serves one goroutine (one partition) at a time.
type Coalescer struct {
	// index maps each class's keys to their slots: a map per class, keyed
	// by the key alone (hashing a string key is cheaper than a struct).
	index [nClasses]map[string]int
	slots []slot
	// strs holds the joined tokens of set ops; buf is where they are
	// joined.
	strs rules.StringArena
	buf  []byte
}

// Coalesce appends to dst the coalesced form of ops and returns it:
//
//   - bumps are deduplicated per key; when two rules bump one key, the
//     kept op carries the rule with the longest rebump_after, so that a
//     hold-off is never lost;
//   - set tokens (set_add, set_remove, and the tokens of set_append ops)
//     for one key are joined in order into one OpSetAppend; a member's
//     earlier tokens are dropped when a later token for it supersedes
//     them, which leaves the set's contents unchanged; a set_delete of
//     the key replaces all of them;
//   - counter deltas are summed per key and a zero sum is dropped; a
//     recount of a key absorbs all of that key's deltas in the batch (the
//     recount runs after the changes and sees them); with opts.Recount
//     every counter key becomes one recount;
//   - with opts.ResetSets every set change becomes a set_delete, one per
//     key;
//   - ops of other kinds are passed through unchanged.
//
// Output ops appear in the order of their key's first op. A coalesced op
// keeps the rule, args and source of its key's first op. Ops for different
// keys are independent, so this order does not matter when applying; it
// only keeps results deterministic.
func (c *Coalescer) Coalesce(dst, ops []rules.Op, opts CoalesceOptions) ([]rules.Op, CoalesceStats) {
	c.reset(len(ops))
	st := CoalesceStats{In: len(ops)}
	var reset rules.Op
	for i := range ops {
		op := &ops[i]
		if opts.ResetSets && (op.Kind == rules.OpSetAdd || op.Kind == rules.OpSetRemove || op.Kind == rules.OpSetAppend) {
			reset = *op
			reset.Kind, reset.Member, reset.Tokens = rules.OpSetDelete, "", ""
			op = &reset
		}
		c.add(op)
	}
	dst = slices.Grow(dst, len(c.slots))
	for i := range c.slots {
		dst = c.emit(dst, &c.slots[i], opts, &st)
	}
	st.Out = len(dst)
	return dst, st
}

// reset empties the coalescer's indexes and slots for a batch of n ops.
func (c *Coalescer) reset(n int) {
	for i := range c.index {
		if c.index[i] == nil {
			c.index[i] = make(map[string]int)
		}
		clear(c.index[i])
	}
	c.slots = c.slots[:0]
	if n > cap(c.slots) {
		// At most one slot per op: allocated once rather than grown by a
		// quarter at a time through a batch of many ops.
		c.slots = slices.Grow(c.slots, n)
	}
}

// add merges op into the slot of its key and class, or a slot of its own.
func (c *Coalescer) add(op *rules.Op) {
	class, ok := classOf(op.Kind)
	if !ok {
		c.newSlot(op)
		return
	}
	index := c.index[class]
	si, seen := index[op.Key]
	if !seen {
		si = c.newSlot(op)
		index[op.Key] = si
	}
	s := &c.slots[si]
	switch class {
	case classBump:
		if seen && op.Rule != nil && (s.op.Rule == nil || op.Rule.RebumpAfter > s.op.Rule.RebumpAfter) {
			s.op.Rule = op.Rule
		}
	case classSet:
		switch op.Kind {
		case rules.OpSetAdd, rules.OpSetRemove:
			s.addToken(op.Kind == rules.OpSetAdd, op.Member)
		case rules.OpSetAppend:
			for _, tok := range strings.Fields(op.Tokens) {
				if tok[0] == '+' || tok[0] == '-' {
					s.addToken(tok[0] == '+', tok[1:])
				}
			}
		case rules.OpSetDelete:
			s.deleted = true
		}
	case classCounter:
		if op.Kind == rules.OpRecount {
			s.recount = true
		} else {
			s.delta += op.Delta
			s.deltaOps++
		}
	}
}

// emit appends the op a slot coalesced into, if any, to dst.
func (c *Coalescer) emit(dst []rules.Op, s *slot, opts CoalesceOptions, st *CoalesceStats) []rules.Op {
	class, ok := classOf(s.op.Kind)
	if !ok {
		return append(dst, s.op)
	}
	out := s.op
	out.Member = ""
	switch class {
	case classBump:
		out.Tokens, out.Delta = "", 0
	case classSet:
		out.Delta = 0
		if s.deleted {
			// Tokens appended to a deleted set are dropped by memcached
			// anyway (an append to a missing item stores nothing): the
			// delete alone has the same end state.
			out.Kind, out.Tokens = rules.OpSetDelete, ""
			return append(dst, out)
		}
		out.Kind = rules.OpSetAppend
		if out.Tokens, c.buf = s.joinTokens(c.buf, &c.strs); out.Tokens == "" {
			return dst
		}
	case classCounter:
		out.Tokens = ""
		switch {
		case s.recount:
			st.RecountsAbsorbed += s.deltaOps
			out.Kind, out.Delta = rules.OpRecount, 0
		case opts.Recount:
			st.DeltasToRecounts++
			out.Kind, out.Delta = rules.OpRecount, 0
		case s.delta == 0:
			st.ZeroSums++
			return dst
		default:
			out.Kind, out.Delta = rules.OpCount, s.delta
		}
	}
	return append(dst, out)
}

// addToken appends a set token, superseding the member's earlier one.
func (s *slot) addToken(add bool, member string) {
	n := len(s.tokens)
	switch {
	case n < tokenScan:
		for i := range s.tokens {
			if t := &s.tokens[i]; !t.dead && t.member == member {
				t.dead = true
				break
			}
		}
	case n == tokenScan:
		// Index the live tokens from now on.
		if s.members == nil {
			s.members = make(map[string]int)
		} else {
			clear(s.members)
		}
		for i, t := range s.tokens {
			if !t.dead {
				s.members[t.member] = i
			}
		}
		fallthrough
	default:
		if prev, ok := s.members[member]; ok {
			s.tokens[prev].dead = true
		}
		s.members[member] = n
	}
	s.tokens = append(s.tokens, setToken{add: add, member: member})
}

// joinTokens renders the live tokens as "+m1 -m2 " into buf and returns
// them as a string copied into strs.
func (s *slot) joinTokens(buf []byte, strs *rules.StringArena) (string, []byte) {
	buf = buf[:0]
	for _, t := range s.tokens {
		if t.dead {
			continue
		}
		if t.add {
			buf = append(buf, '+')
		} else {
			buf = append(buf, '-')
		}
		buf = append(buf, t.member...)
		buf = append(buf, ' ')
	}
	return strs.Copy(buf), buf
}

// Coalesce is Coalescer.Coalesce with fresh scratch memory.
func Coalesce(dst, ops []rules.Op, opts CoalesceOptions) ([]rules.Op, CoalesceStats) {
	var c Coalescer
	return c.Coalesce(dst, ops, opts)
}
