package rules

import (
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"time"
)

// MaxTTL is the longest item TTL a rule may set. Memcached reads an
// expiry above 30 days as an absolute Unix time, so longer TTLs would
// expire items at once.
const MaxTTL = 30 * 24 * time.Hour

// RuleSet is a loaded, validated set of rules. It is immutable and safe for
// concurrent use; Plan may be called from many goroutines. Package
// rulefile loads one from rule files; NewRuleSet builds one from rules
// constructed in Go.
type RuleSet struct {
	rules   []*Rule
	byName  map[string]*Rule
	byTable map[string][]*Rule
	scratch sync.Pool // of *planScratch
	// fallbackRule is the rule of fallback bumps: no TTL, no second bump.
	fallbackRule *Rule
	// generationRule is the rule of generation bumps (GenerationOp).
	generationRule *Rule
}

// Rules returns the rules in load order (files in the order given, rules
// in file order). The slice must not be modified.
func (rs *RuleSet) Rules() []*Rule { return rs.rules }

// Rule returns the rule with the given name, or nil.
func (rs *RuleSet) Rule(name string) *Rule { return rs.byName[name] }

// Problem is one error found in a rule file. Line and Column are 1-based;
// both are 0 when the problem concerns the whole file (it cannot be read,
// for instance).
type Problem struct {
	File   string
	Line   int
	Column int
	Msg    string
}

// String formats the problem as file:line:col: msg (file: msg without a
// position).
func (p Problem) String() string {
	if p.Line == 0 {
		return fmt.Sprintf("%s: %s", p.File, p.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Column, p.Msg)
}

// LoadError holds every problem found while loading rule files, in file
// order and then by position.
type LoadError struct {
	Problems []Problem
}

// Error returns the problems, one per line.
func (e *LoadError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// NewRuleSet checks rules and returns them as a rule set, in the order
// given. It is how rule files become a RuleSet (package rulefile) and how
// a program builds one without any file: fill in each Rule's exported
// fields (Name, Kind, Table, Key, the kind's fields; On nil means insert,
// update and delete) and pass them here. Every problem found is reported
// at once in a *LoadError, located at the rule's File, Line and Column.
//
// NewRuleSet completes the rules (it compiles When and indexes On); they
// must not be modified afterwards, nor passed to NewRuleSet again.
func NewRuleSet(rules []*Rule) (*RuleSet, error) {
	var problems []Problem
	byName := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		bad := func(format string, args ...any) {
			problems = append(problems, Problem{File: r.File, Line: r.Line, Column: r.Column,
				Msg: fmt.Sprintf("rule %q: ", r.Name) + fmt.Sprintf(format, args...)})
		}
		if r.Name == "" {
			bad("no name")
		} else if first, dup := byName[r.Name]; dup {
			bad("duplicate rule name (first defined at %s:%d:%d)", first.File, first.Line, first.Column)
		} else {
			byName[r.Name] = r
		}
		for _, p := range r.check() {
			bad("%s", p)
		}
		if r.When != "" {
			p, err := compilePredicate(r.When)
			if err != nil {
				bad("when: %v", err)
			}
			r.pred = p
		}
		r.onMask = 0
		if r.On == nil {
			r.On = []Operation{Insert, Update, Delete}
		}
		for _, op := range r.On {
			r.onMask |= 1 << op
		}
	}
	if len(problems) > 0 {
		return nil, &LoadError{Problems: problems}
	}
	rs := &RuleSet{rules: rules, byName: byName, byTable: make(map[string][]*Rule),
		fallbackRule:   &Rule{Name: "fallback", Kind: BumpRule},
		generationRule: &Rule{Name: "generation", Kind: BumpRule}}
	for _, r := range rules {
		rs.byTable[r.Table] = append(rs.byTable[r.Table], r)
		if r.Kind == SetRule || r.Kind == CountRule {
			r.Generation = GenerationKey(r.Prefix, r.Database, r.Table)
		}
	}
	rs.scratch.New = func() any { return new(planScratch) }
	return rs, nil
}

// check returns what is wrong with a rule's fields, beyond its name and
// its `when`.
func (r *Rule) check() []string {
	var out []string
	if r.Table == "" {
		out = append(out, "no table")
	}
	switch r.Kind {
	case BumpRule, SetRule, CountRule:
	default:
		out = append(out, fmt.Sprintf("unknown kind %d", r.Kind))
	}
	if r.Key == nil {
		out = append(out, "no key template")
	}
	if err := CheckLiteral(r.Prefix); err != nil {
		out = append(out, fmt.Sprintf("prefix %q: %v", r.Prefix, err))
	}
	if (r.Kind == SetRule) != (r.Member != nil) {
		out = append(out, "a member template belongs to set rules, and every set rule has one")
	}
	if r.Query == "" && (len(r.Args) > 0 || r.Keys != "") {
		out = append(out, "args and keys need a load or recount query")
	}
	if r.Query != "" {
		if r.Kind == BumpRule {
			out = append(out, "bump rules have no query")
		} else if n := CountPlaceholders(r.Query); n != len(r.Args) {
			out = append(out, fmt.Sprintf("query has %d '?' placeholder(s) but %d args", n, len(r.Args)))
		}
	}
	if r.TTL < 0 || r.TTL > MaxTTL || r.TTL%time.Second != 0 {
		out = append(out, fmt.Sprintf("ttl %v is not whole seconds between 0 and 30 days", r.TTL))
	}
	if r.Kind != BumpRule && (r.RebumpAfter != 0 || len(r.Columns) > 0) {
		out = append(out, "rebump_after and columns belong to bump rules")
	}
	if r.RebumpAfter < 0 {
		out = append(out, "negative rebump_after")
	}
	seen := make(map[Operation]bool, len(r.On))
	for _, op := range r.On {
		switch {
		case op < Insert || op > Truncate:
			out = append(out, fmt.Sprintf("unknown operation %d in on", op))
		case seen[op]:
			out = append(out, fmt.Sprintf("operation %s listed twice in on", op))
		case op == Truncate && (r.Kind != BumpRule || (r.Key != nil && r.Key.HasPlaceholders())):
			out = append(out, "truncate needs a bump rule whose key has no placeholders")
		}
		seen[op] = true
	}
	if r.On != nil && len(r.On) == 0 {
		out = append(out, "on lists no operation")
	}
	if r.Copies != 0 && (r.Kind != BumpRule || r.Copies < 2 || r.Copies > MaxCopies) {
		out = append(out, fmt.Sprintf("copies %d: bump rules only, from 2 to %d", r.Copies, MaxCopies))
	}
	if ev := r.Evidence; ev != nil {
		out = append(out, r.checkEvidence()...)
	}
	return out
}

// checkEvidence checks a rule's Evidence and completes it (master key,
// entity column, defaults).
func (r *Rule) checkEvidence() []string {
	ev := r.Evidence
	var out []string
	if r.Kind != BumpRule || r.Copies != 0 {
		out = append(out, "evidence belongs to bump rules without copies")
	}
	if ev.Bits == 0 {
		ev.Bits = DefaultEvidenceBits
	}
	if ev.Bits < 8 || ev.Bits > MaxEvidenceBits || ev.Bits%8 != 0 {
		out = append(out, fmt.Sprintf("evidence bits %d: a multiple of 8 from 8 to %d", ev.Bits, MaxEvidenceBits))
	}
	if ev.MaxSet == 0 {
		ev.MaxSet = max(ev.Bits/4, 1)
	}
	if ev.MaxSet < 1 || ev.MaxSet > ev.Bits {
		out = append(out, fmt.Sprintf("evidence max_set %d: from 1 to the %d bits", ev.MaxSet, ev.Bits))
	}
	if ev.Master == nil || ev.Master.HasPlaceholders() {
		out = append(out, "evidence needs a master key without placeholders")
	} else {
		ev.MasterKey = FinishKey(append([]byte(r.Prefix), ev.Master.String()...))
	}
	if r.Key != nil {
		cols := r.Key.Columns()
		for _, c := range cols[min(1, len(cols)):] {
			if c != cols[0] {
				cols = nil
				break
			}
		}
		if len(cols) == 0 {
			out = append(out, fmt.Sprintf("evidence needs a bump key with one placeholder column, the entity id; %q has not", r.Key.String()))
		} else {
			ev.Column = cols[0]
		}
	}
	return out
}

// DefaultEvidenceBits is Evidence.Bits's default.
const DefaultEvidenceBits = 64

// EvidenceBit returns the bit of an entity id (the text of its value) in
// an evidence bitmap of bits bits: for an optionally signed decimal
// integer, its absolute value modulo bits (computed digit by digit, so
// ids of any size work); for any other text, the CRC-32 (IEEE) of its
// bytes modulo bits.
func EvidenceBit(id string, bits int) int {
	digits := strings.TrimPrefix(id, "-")
	if digits != "" && strings.Trim(digits, "0123456789") == "" {
		r := 0
		for i := 0; i < len(digits); i++ {
			r = (r*10 + int(digits[i]-'0')) % bits
		}
		return r
	}
	return int(crc32.ChecksumIEEE([]byte(id)) % uint32(bits))
}

// CountPlaceholders counts the '?' placeholders of an SQL statement,
// ignoring those inside quoted strings, quoted identifiers and comments.
func CountPlaceholders(sql string) int {
	n := 0
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; c {
		case '?':
			n++
		case '\'', '"', '`':
			for i++; i < len(sql); i++ {
				if sql[i] == '\\' && c != '`' {
					i++
					continue
				}
				if sql[i] == c {
					if i+1 < len(sql) && sql[i+1] == c { // doubled quote
						i++
						continue
					}
					break
				}
			}
		case '#':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case '-':
			if i+2 < len(sql) && sql[i+1] == '-' && (sql[i+2] == ' ' || sql[i+2] == '\t') {
				for i < len(sql) && sql[i] != '\n' {
					i++
				}
			}
		case '/':
			if i+1 < len(sql) && sql[i+1] == '*' {
				end := strings.Index(sql[i+2:], "*/")
				if end < 0 {
					return n
				}
				i += end + 3
			}
		}
	}
	return n
}

// Reads reports whether some rule reads the changes of table in database
// db: a source may skip the changes of the others before decoding them.
func (rs *RuleSet) Reads(db, table string) bool {
	for _, r := range rs.byTable[table] {
		if r.Database == "" || r.Database == db {
			return true
		}
	}
	return false
}

// Queries reports whether some rule of table in database db runs a MySQL
// query (a set's load, a counter's recount): applying its changes may
// read the database.
func (rs *RuleSet) Queries(db, table string) bool {
	for _, r := range rs.byTable[table] {
		if (r.Database == "" || r.Database == db) && r.Query != "" {
			return true
		}
	}
	return false
}
