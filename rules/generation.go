package rules

// GenerationKey returns the key of the generation item of a table
// (docs/formats.md, "Generations"): prefix, "%gen:", the escaped database
// and a '.' when db is not "", the escaped table, through FinishKey. The
// sets and counters of every set and count rule of the file matching
// that table spec are valid only under the item's current value.
func GenerationKey(prefix, db, table string) string {
	buf := make([]byte, 0, len(prefix)+len(db)+len(table)+6)
	buf = append(buf, prefix...)
	buf = append(buf, GenerationMark...)
	if db != "" {
		buf = AppendEscaped(buf, db)
		buf = append(buf, '.')
	}
	buf = AppendEscaped(buf, table)
	return FinishKey(buf)
}

// GenerationKeys appends to dst the generation keys that cover a change
// of db.table: the Generation key of every set and count rule that
// matches that table, each key once. With table "" (a change whose table
// is unknown) it appends every generation key of the rule set. It is
// safe for concurrent use.
func (rs *RuleSet) GenerationKeys(dst []string, db, table string) []string {
	return rs.tableKeys(dst, db, table, func(r *Rule) string { return r.Generation })
}

// Covered reports whether a lost change of db.table (table "" for an
// unknown table) is covered: every rule that may match it keeps its
// items correct without the change, a bump rule by its fallback
// namespace, a set or count rule by its table's generation. A table no
// rule matches is covered (nothing of it is cached). It is safe for
// concurrent use.
func (rs *RuleSet) Covered(db, table string) bool {
	ok := func(r *Rule) bool {
		if r.Kind == BumpRule {
			return r.Fallback != ""
		}
		return r.Generation != ""
	}
	if table == "" {
		for _, r := range rs.rules {
			if !ok(r) {
				return false
			}
		}
		return true
	}
	for _, r := range rs.byTable[table] {
		if (r.Database == "" || db == "" || r.Database == db) && !ok(r) {
			return false
		}
	}
	return true
}

// GenerationOp returns the bump of a generation key (see GenerationKeys)
// for a change at src that was lost or emptied the table (a truncate).
// Its Rule is a bump rule named "generation", without TTL or second bump.
func (rs *RuleSet) GenerationOp(key string, src Position) Op {
	return Op{Kind: OpBump, Rule: rs.generationRule, Key: key, Source: src}
}

// appendTruncateGenerations appends the generation bumps of a truncate of
// ev's table: one per generation key of the set and count rules among
// cands that match ev's database.
func (rs *RuleSet) appendTruncateGenerations(dst []Op, cands []*Rule, ev *Event) []Op {
	start := len(dst)
next:
	for _, r := range cands {
		if r.Generation == "" || (r.Database != "" && r.Database != ev.Database) {
			continue
		}
		for i := start; i < len(dst); i++ {
			if dst[i].Key == r.Generation {
				continue next
			}
		}
		dst = append(dst, rs.GenerationOp(r.Generation, ev.Source))
	}
	return dst
}
