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
)

// String returns the name used in plan output (DESIGN §4).
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
}
