package rules

import "time"

// RuleKind is what a rule maintains.
type RuleKind uint8

const (
	// BumpRule keeps a namespace version key.
	BumpRule RuleKind = iota + 1
	// SetRule keeps a set of members in one item.
	SetRule
	// CountRule keeps a counter.
	CountRule
)

// String returns the rule kind's name as written in rule files.
func (k RuleKind) String() string {
	switch k {
	case BumpRule:
		return "bump"
	case SetRule:
		return "set"
	case CountRule:
		return "count"
	}
	return "unknown"
}

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
	// Copies, for bump rules, is how many copies of each namespace are
	// kept for readers to spread a hot key over (docs/formats.md): every
	// bump bumps all of them. Copy i lives at CopyKey(key, i). 0 means one
	// item, at the key itself.
	Copies int
	// Evidence, for bump rules, keeps a master namespace with an evidence
	// bitmap beside the entities' own namespaces (docs/formats.md); nil
	// when the rule has none.
	Evidence *Evidence
	// Query is the set rule's load query or the count rule's recount
	// query, with '?' placeholders bound to an op's Args; "" when none.
	Query string
	// File, Line and Column locate the rule's definition.
	File   string
	Line   int
	Column int
	// At locates the values of the rule's fields in File, by field name,
	// a nested field under its parent's ("when", "count.recount",
	// "set.key"); nil for rules built in Go. Tools that report on a
	// loaded rule (cachewarden check) point at them.
	At map[string]Location

	// Fallback is the final key of the fallback namespace of the rule's
	// file for the rule's table (the file's fallback template rendered
	// with the table's db and name); "" when the file has none. The
	// daemon bumps it when a change of that table cannot be planned or
	// its ops cannot be delivered.
	Fallback string

	// Generation, for set and count rules, is the key of the generation
	// item of the rule's table (GenerationKey of Prefix, Database and
	// Table; set by NewRuleSet): sets and counters are valid only under
	// its current value (docs/formats.md, "Generations"). The daemon
	// bumps it when a change of the table is lost or the table is
	// truncated. "" for bump rules.
	Generation string

	// Database is the database the rule matches; "" matches any.
	Database string
	// Table is the table the rule matches (exact, case-sensitive).
	Table string
	// On lists the operations the rule handles, in file order. The
	// default is insert, update, delete.
	On []Operation
	// When is the predicate's source text; "" when the rule has none (it
	// then holds on every image).
	When string
	// Columns, for bump rules, lists the columns of which at least one
	// must change for an update to bump; nil means every update bumps.
	// The key's placeholder columns and the truth of `when` always count
	// as listed, so a row that moves between keys is bumped at both.
	Columns []string
	// Key is the key template: the namespace key of a bump rule, the set
	// key or the counter key. The file prefix is not part of it.
	Key *Template
	// Member is a set rule's member template; nil for other kinds.
	Member *Template
	// Args are the columns whose values are bound, in order, to Query's
	// '?' placeholders; the default is Key's columns. nil when Query is "".
	Args []string
	// AcceptFolding records the rule's `collation: accept-folding`: the
	// rule's owner accepts that its key, member and args columns may have
	// a collation that compares values of different bytes as equal ('a' =
	// 'A', 'e' = 'é', 'a' = 'a '), because the database holds one
	// spelling of each such value and readers pass only values read from
	// it (docs/rules.md, "Collations"). Without it, `cachewarden check
	// --dsn` reports such columns as errors and `run` refuses the rule.
	// false by default.
	AcceptFolding bool
	// Keys, for set and count rules, is an optional query (no
	// placeholders) that lists the keys `cachewarden verify` checks: each
	// row holds the values of Key's placeholder columns, one column per
	// distinct placeholder in order of first appearance. "" when none.
	Keys string

	// onMask has bit 1<<Operation set for each operation in On.
	onMask uint8
	// pred is the compiled When; nil when When is "".
	pred *predicate
	// nameLine and nameColumn locate the name, for duplicate reports.
	nameLine, nameColumn int
}

// Location is a 1-based line and column in a file.
type Location struct{ Line, Column int }

// MaxCopies bounds Rule.Copies.
const MaxCopies = 64

// Evidence configures a master namespace with an evidence bitmap: one item
// holding a master version and one bit per entity id modulo Bits. An
// entity whose bit is clear uses the master version; the daemon sets the
// bit of every entity it bumps, and readers of an entity whose bit is set
// use its own namespace.
type Evidence struct {
	// Master is the master item's key template, without placeholders;
	// the rule's prefix goes in front of it.
	Master *Template
	// MasterKey is the master item's final key (set by NewRuleSet).
	MasterKey string
	// Bits is the number of bits of the bitmap: a multiple of 8 from 8 to
	// MaxEvidenceBits. Default 64.
	Bits int
	// MaxSet is the most bits the bitmap holds: the daemon rolls the
	// master (a new version, every bit clear) rather than set one more.
	// From 1 to Bits; default Bits/4.
	MaxSet int
	// Column is the entity id: the bump key's one placeholder column (set
	// by NewRuleSet).
	Column string
}

// MaxEvidenceBits bounds Evidence.Bits.
const MaxEvidenceBits = 8192

// Handles reports whether the rule lists op in its `on` list.
func (r *Rule) Handles(op Operation) bool { return r.onMask&(1<<op) != 0 }

// Matches reports whether the rule applies to rows of database.table.
func (r *Rule) Matches(database, table string) bool {
	return r.Table == table && (r.Database == "" || r.Database == database)
}
