package rules

// OpKind is the kind of a cache operation.
type OpKind uint8

const (
	// OpBump increments a namespace version key.
	OpBump OpKind = iota + 1
	// OpSetAdd appends "+member " to a set.
	OpSetAdd
	// OpSetRemove appends "-member " to a set.
	OpSetRemove
	// OpCount adds Delta to a counter.
	OpCount
	// OpRecount recomputes a counter from MySQL.
	OpRecount
	// OpSetAppend is produced by coalescing, never by the planner: Tokens
	// holds every set token of a batch for Key, joined in order
	// ("+m1 -m2 ").
	OpSetAppend
	// OpSetRebuild is produced by replay, never by the planner: delete the
	// set at Key, then store the full set its rule's load query returns
	// (bound to Args), as a missing set is loaded; the set stays missing
	// when the query fails or the rule has none.
	OpSetRebuild
	// OpSetDelete deletes a set item (a missing set is always correct).
	// The planner never produces it: replay deletes the sets it touched
	// whose rule has no load query, and the daemon turns the set changes
	// of a rule whose changes may arrive out of order (docs/operations.md,
	// "Ordering across partitions") into deletes of the set.
	OpSetDelete
)

// PlannedKinds are the kinds planning produces (RuleSet.Plan), in the
// order messages list them: the ops `plan` prints and rule tests expect.
// The others are the applier's and replay's own.
var PlannedKinds = []OpKind{OpBump, OpSetAdd, OpSetRemove, OpCount, OpRecount}

// ParsePlannedKind returns the planned kind named s (OpKind.String); ok
// is false for any other name.
func ParsePlannedKind(s string) (k OpKind, ok bool) {
	for _, k := range PlannedKinds {
		if k.String() == s {
			return k, true
		}
	}
	return 0, false
}

// String returns the name used in plan output (docs/rules.md).
func (k OpKind) String() string {
	switch k {
	case OpBump:
		return "bump"
	case OpSetAdd:
		return "set_add"
	case OpSetRemove:
		return "set_remove"
	case OpCount:
		return "count"
	case OpRecount:
		return "recount"
	case OpSetAppend:
		return "set_append"
	case OpSetRebuild:
		return "set_rebuild"
	case OpSetDelete:
		return "set_delete"
	}
	return "unknown"
}

// Op is one cache operation planned for one row change (or, for
// OpSetAppend, a coalesced group of them).
type Op struct {
	Kind OpKind
	// Rule is the rule that produced the op; never nil for planned ops.
	Rule *Rule
	// Key is the final memcached key (prefix included, escaped, hashed
	// when long).
	Key string
	// Member is the escaped set member (OpSetAdd, OpSetRemove).
	Member string
	// Tokens is the joined token string of an OpSetAppend.
	Tokens string
	// Delta is the counter change (OpCount); never zero.
	Delta int64
	// Args are the values bound to the rule's load or recount query, taken
	// from the row image that produced Key.
	Args []Value
	// Source is the position of the event that produced the op.
	Source Position
	// EvidenceBit, for a bump of a rule with Evidence, is the entity's bit
	// in the master's bitmap (EvidenceBit of its id).
	EvidenceBit int
	// Legacy marks an op on the key that releases before the "%#" and
	// "%copy" marks used for a hashed long key or a hot-key copy
	// (docs/formats.md, "Keys"): a bump of the old namespace key, or a
	// delete (OpSetDelete) of the old set or counter, so that readers not
	// yet upgraded never read a value the daemon no longer maintains.
	Legacy bool
}
