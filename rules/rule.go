package rules

import "time"

// RuleKind is what a rule maintains.
type RuleKind uint8

const (
	// RuleBump keeps a namespace version key.
	RuleBump RuleKind = iota + 1
	// RuleSet keeps a set of members in one item.
	RuleSet
	// RuleCount keeps a counter.
	RuleCount
)

// Rule is one loaded rule. Fields are read-only after loading.
type Rule struct {
	Name string
	Kind RuleKind
	// Prefix is the file's key prefix, already included in planned keys.
	Prefix string
	// TTL is the memcached item TTL; 0 means no expiry.
	TTL time.Duration
	// RebumpAfter, for bump rules, is the delay of the second bump; 0 means
	// none.
	RebumpAfter time.Duration
	// Query is the set rule's load query or the count rule's recount
	// query, with '?' placeholders bound to an op's Args; "" when none.
	Query string
	// File, Line and Column locate the rule's definition.
	File   string
	Line   int
	Column int
}
