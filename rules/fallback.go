package rules

import "slices"

// FallbackKeys appends to dst the fallback namespace keys that cover a
// change of db.table: the Fallback key of every rule that matches that
// table, each key once. With table "" (a change whose table is unknown,
// such as an undecodable message) it appends every fallback key of the
// rule set. It is safe for concurrent use.
func (rs *RuleSet) FallbackKeys(dst []string, db, table string) []string {
	return rs.tableKeys(dst, db, table, func(r *Rule) string { return r.Fallback })
}

// tableKeys appends to dst key(r), when not "", of every rule r that
// matches db.table (every rule when table is ""), each key once.
func (rs *RuleSet) tableKeys(dst []string, db, table string, key func(*Rule) string) []string {
	start := len(dst)
	add := func(r *Rule) {
		k := key(r)
		if k == "" || slices.Contains(dst[start:], k) {
			return
		}
		dst = append(dst, k)
	}
	if table == "" {
		for _, r := range rs.rules {
			add(r)
		}
		return dst
	}
	for _, r := range rs.byTable[table] {
		if r.Database == "" || db == "" || r.Database == db {
			add(r)
		}
	}
	return dst
}

// FallbackOp returns the bump of a fallback namespace key (see FallbackKeys),
// for a change at src that could not be planned or delivered. Its Rule is
// a bump rule without a name of its own; the key carries the file's
// prefix already.
func (rs *RuleSet) FallbackOp(key string, src Position) Op {
	return Op{Kind: OpBump, Rule: rs.fallbackRule, Key: key, Source: src}
}

// Tables returns the tables the rules match, as db.table or table (for
// rules matching any database), each once, in rule order.
func (rs *RuleSet) Tables() []string {
	var out []string
	seen := make(map[string]bool)
	for _, r := range rs.rules {
		t := r.Table
		if r.Database != "" {
			t = r.Database + "." + r.Table
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
