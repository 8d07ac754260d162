package check

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// This file finds key, member and args columns whose collation compares
// values of different bytes as equal ('a' = 'A', 'e' = 'é', 'a' = 'a '):
// the database answers `tag = 'T1'` with the rows of 't1', but change
// events carry the row's own bytes, so a change moves only the key of
// its own spelling and keys built from the other keep stale data. What a
// collation folds is asked of the server, by comparing sample strings
// under it, never guessed from its name: `utf8mb4_bin` is PAD SPACE on
// MariaDB ('a' = 'a '), the `utf8mb4_0900_*` collations of MySQL 8 are
// NO PAD.

// folding is what a collation compares as equal that bytes do not.
type folding struct {
	cases, accents, spaces bool
	// Equivalences of Unicode collations: 'ß' and 'ss', a composed and a
	// decomposed accent, a full-width and an ASCII letter.
	sharpS, decomposed, width bool
}

func (f folding) any() bool {
	return f.cases || f.accents || f.spaces || f.sharpS || f.decomposed || f.width
}

// describe names what f folds, with an example of each.
func (f folding) describe() string {
	var parts []string
	for _, p := range []struct {
		folds bool
		what  string
	}{
		{f.cases, "case ('a' = 'A')"},
		{f.accents, "accents ('e' = 'é')"},
		{f.spaces, "trailing spaces ('a' = 'a ', PAD SPACE)"},
		{f.sharpS, "expansions ('ß' = 'ss')"},
		{f.decomposed, "composition ('é' = 'e' + U+0301)"},
		{f.width, "width ('Ａ' = 'A')"},
	} {
		if p.folds {
			parts = append(parts, p.what)
		}
	}
	switch len(parts) {
	case 0:
		return "nothing"
	case 1:
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// example returns two values f makes equal, quoted for a message: the
// spelling of a change event and another a reader may pass.
func (f folding) example() (stored, other string) {
	switch {
	case f.cases:
		return `"t1"`, `"T1"`
	case f.accents:
		return `"cafe"`, `"café"`
	case f.spaces:
		return `"a"`, `"a "`
	case f.sharpS:
		return `"strasse"`, `"straße"`
	case f.decomposed:
		return `"caf\u00e9"`, `"cafe\u0301"`
	}
	return `"A1"`, `"Ａ1"`
}

// sqlName matches charset and collation names: only such names, read
// from information_schema or a rule's query, are written into the text
// of the queries that test them.
var sqlName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// binaryCollation names exact comparison of bytes: a binary column,
// BINARY x, CAST(x AS BINARY).
const binaryCollation = "binary"

// folds asks the server what collation coll folds; charset is its
// character set, "" to look it up. Results are cached per collation.
func (s *Schema) folds(ctx context.Context, charset, coll string) (folding, error) {
	coll = strings.ToLower(coll)
	if coll == binaryCollation {
		return folding{}, nil
	}
	if f, ok := s.folded[coll]; ok {
		return f, nil
	}
	if charset == "" {
		err := s.conn.QueryRowContext(ctx, "SELECT CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME = ?", coll).Scan(&charset)
		if err == sql.ErrNoRows {
			return folding{}, fmt.Errorf("collation %s: the server has no such collation", coll)
		}
		if err != nil {
			return folding{}, fmt.Errorf("information_schema.COLLATIONS: %w", err)
		}
	}
	if !sqlName.MatchString(charset) || !sqlName.MatchString(coll) {
		return folding{}, fmt.Errorf("collation %q of character set %q: not a plain name", coll, charset)
	}
	eq := func() string {
		return fmt.Sprintf("CONVERT(? USING %s) COLLATE %s = CONVERT(? USING %s)", charset, coll, charset)
	}
	// Pairs of different bytes: case, accents, trailing spaces, then
	// Unicode equivalents. A character the charset lacks converts to '?',
	// which equals none of the others.
	pairs := []any{"a", "A", "e", "é", "a", "a ", "ß", "ss", "é", "e\u0301", "Ａ", "A"}
	q := "SELECT " + strings.Repeat(eq()+", ", len(pairs)/2-1) + eq()
	eqs := make([]sql.NullBool, len(pairs)/2)
	dest := make([]any, len(eqs))
	for i := range eqs {
		dest[i] = &eqs[i]
	}
	if err := s.conn.QueryRowContext(ctx, q, pairs...).Scan(dest...); err != nil {
		return folding{}, fmt.Errorf("compare under collation %s: %w", coll, err)
	}
	f := folding{cases: eqs[0].Bool, accents: eqs[1].Bool, spaces: eqs[2].Bool,
		sharpS: eqs[3].Bool, decomposed: eqs[4].Bool, width: eqs[5].Bool}
	if s.folded == nil {
		s.folded = map[string]folding{}
	}
	s.folded[coll] = f
	s.Log.Debug("collation compared", "collation", coll, "case", f.cases, "accents", f.accents, "trailing_spaces", f.spaces, "expansions", f.sharpS, "composition", f.decomposed, "width", f.width)
	return f, nil
}

// exactCollation returns a collation of charset that the server says
// folds nothing: <charset>_nopad_bin (MariaDB), <charset>_0900_bin
// (MySQL 8), else "binary".
func (s *Schema) exactCollation(ctx context.Context, charset string) (string, error) {
	for _, name := range []string{charset + "_nopad_bin", charset + "_0900_bin"} {
		var n int
		if err := s.conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.COLLATIONS WHERE COLLATION_NAME = ?", name).Scan(&n); err != nil {
			return "", fmt.Errorf("information_schema.COLLATIONS: %w", err)
		}
		if n == 0 {
			continue
		}
		f, err := s.folds(ctx, charset, name)
		if err != nil {
			return "", err
		}
		if !f.any() {
			return name, nil
		}
	}
	return binaryCollation, nil
}

// exactIn reports whether one of the collations a query names for a
// column folds nothing; else folded is the first one's folding.
func (s *Schema) exactIn(ctx context.Context, names []string) (exact bool, first string, folded folding, err error) {
	for i, n := range names {
		f, err := s.folds(ctx, "", n)
		if err != nil {
			return false, "", folding{}, err
		}
		if !f.any() {
			return true, n, f, nil
		}
		if i == 0 {
			first, folded = n, f
		}
	}
	return false, first, folded, nil
}

// collations reports key, member and args columns of c's rule whose
// collation folds, unless the rule accepts folding; and a keys query
// whose DISTINCT or GROUP BY folds a key column.
func (s *Schema) collations(ctx context.Context, c *ruleCheck, t *table) error {
	r := c.r
	if r.AcceptFolding {
		return nil
	}
	cc := &collationCheck{c: c, tname: r.Table, explicit: explicitCollations(r.Query), done: map[string]bool{}}
	if r.Database != "" {
		cc.tname = r.Database + "." + r.Table
	}
	_, cc.qname = queryField(r)
	var keyFolds []foldedColumn
	for _, ref := range refs(r) {
		if ref.role != roleKey && ref.role != roleMember && ref.role != roleArg {
			continue
		}
		cl := t.column(ref.name)
		if cl == nil || !cl.Collation.Valid || cc.done[cl.Name] {
			continue
		}
		f, err := s.folds(ctx, cl.Charset.String, cl.Collation.String)
		if err != nil {
			return err
		}
		if ref.role == roleKey && f.any() {
			keyFolds = append(keyFolds, foldedColumn{cl, f})
		}
		if err := s.columnFolding(ctx, cc, ref, cl, f); err != nil {
			return err
		}
	}
	return s.keysQueryFolding(ctx, c, keyFolds)
}

// collationCheck is what collations shares between a rule's columns.
type collationCheck struct {
	c *ruleCheck
	// tname is the rule's table as db.table (or table), qname the field
	// of its query.
	tname, qname string
	// explicit are the COLLATE clauses of the rule's query by column.
	explicit map[string][]string
	// done are the columns already reported or found exact.
	done map[string]bool
}

// foldedColumn is a key column whose collation folds f.
type foldedColumn struct {
	cl *column
	f  folding
}

// columnFolding reports column cl of ref when it compares values that
// differ as equal (f, or the collation its query compares it under) and
// says what that breaks for the rule and how to fix it.
func (s *Schema) columnFolding(ctx context.Context, cc *collationCheck, ref colRef, cl *column, f folding) error {
	r := cc.c.r
	how := fmt.Sprintf("column %s.%s has collation %s", cc.tname, cl.Name, cl.Collation.String)
	compared := r.Query != "" && ref.role != roleMember && containsCol(r.Args, cl.Name)
	if names := cc.explicit[strings.ToLower(cl.Name)]; compared && len(names) > 0 {
		exact, name, qf, err := s.exactIn(ctx, names)
		if err != nil {
			return err
		}
		if exact {
			cc.done[cl.Name] = true
			return nil // the query compares it exactly
		}
		f = qf
		how = fmt.Sprintf("%s compares %s under COLLATE %s", cc.qname, cl.Name, name)
	}
	if !f.any() {
		return nil
	}
	cc.done[cl.Name] = true
	exact, err := s.exactCollation(ctx, cl.Charset.String)
	if err != nil {
		return err
	}
	cc.c.add(ref.field, Error, "%s: %s, which compares as equal values that differ in %s: %s. Fix: %s",
		ref.what, how, f.describe(), foldingHarm(r, ref, cl, cc.qname, f), s.foldingFix(r, cl, cc.tname, cc.qname, exact, compared))
	return nil
}

// foldingHarm says what a column of ref folding f breaks for rule r.
func foldingHarm(r *rules.Rule, ref colRef, cl *column, qname string, f folding) string {
	stored, other := f.example()
	switch {
	case ref.role == roleMember:
		return fmt.Sprintf("a reader that asks whether %s is a member misses the member %s that the database finds equal to it", other, stored)
	case ref.role == roleArg && r.Key != nil && !containsCol(r.Key.Columns(), cl.Name):
		return fmt.Sprintf("%s bound to %s also finds the rows holding %s, whose changes carry %s and move no key of this rule's row: the key can keep what they changed", qname, stored, other, other)
	case r.Kind == rules.BumpRule:
		return fmt.Sprintf("application queries find the same rows for %s and %s, but a change of a row holding %s bumps only the namespace built from %s: results cached under the other stay stale", stored, other, stored, stored)
	}
	return fmt.Sprintf("keys built from %s and %s hold the same rows (the database finds them equal), but a change of a row holding %s moves only the key built from %s: the other keeps stale data until it expires (the rule's ttl; never without one)", stored, other, stored, stored)
}

// keysQueryFolding reports each folding key column of keyFolds that the
// rule's keys query collapses (DISTINCT, GROUP BY or UNION) under a
// folding collation.
func (s *Schema) keysQueryFolding(ctx context.Context, c *ruleCheck, keyFolds []foldedColumn) error {
	r := c.r
	if r.Keys == "" || len(keyFolds) == 0 || !collapses(r.Keys) {
		return nil
	}
	kexplicit := explicitCollations(r.Keys)
	for _, kf := range keyFolds {
		cl, coll, f := kf.cl, "collation "+kf.cl.Collation.String, kf.f
		if names := kexplicit[strings.ToLower(cl.Name)]; len(names) > 0 {
			exact, name, qf, err := s.exactIn(ctx, names)
			if err != nil {
				return err
			}
			if exact {
				continue
			}
			coll, f = "COLLATE "+name, qf
		}
		exact, err := s.exactCollation(ctx, cl.Charset.String)
		if err != nil {
			return err
		}
		c.add(kindField(r, "keys"), Error, "keys: its DISTINCT, GROUP BY or UNION compares %s under %s, which folds %s: one row stands for all the spellings the database finds equal, so `cachewarden verify` never checks the keys of the others. Fix: select %s",
			cl.Name, coll, f.describe(), selectExact(cl.Name, exact))
	}
	return nil
}

// foldingFix says how to make a rule's comparisons of cl exact.
func (s *Schema) foldingFix(r *rules.Rule, cl *column, tname, qname, exact string, compared bool) string {
	var col string
	if exact == binaryCollation {
		col = fmt.Sprintf("make %s.%s a binary column (VARBINARY; CDC producers then send bytes, see the binary warning)", tname, cl.Name)
	} else {
		col = fmt.Sprintf("give %s.%s a collation that compares bytes exactly: ALTER TABLE %s MODIFY %s %s COLLATE %s (repeating its NULL, default and comment)",
			tname, cl.Name, r.Table, cl.Name, cl.ColumnType, exact)
	}
	accept := "or, when the database holds one spelling of each value (a unique index under this collation) and readers pass only values read from it, accept the folding with `collation: accept-folding` on the rule"
	if r.Kind == rules.BumpRule || !compared {
		return col + "; " + accept
	}
	return fmt.Sprintf("in %s, compare %s; or %s; %s", qname, compareExact(cl.Name, exact), col, accept)
}

// compareExact is col compared with a placeholder under an exact
// collation.
func compareExact(col, exact string) string {
	if exact == binaryCollation {
		return col + " = CAST(? AS BINARY)"
	}
	return col + " = ? COLLATE " + exact
}

// selectExact is col selected under an exact collation.
func selectExact(col, exact string) string {
	if exact == binaryCollation {
		return "CAST(" + col + " AS BINARY)"
	}
	return col + " COLLATE " + exact
}

func containsCol(cols []string, name string) bool {
	for _, c := range cols {
		if c == name {
			return true
		}
	}
	return false
}

// Folding checks only the collations of rs's key, member, args and keys
// columns (what Check reports of them) against the server of dsn: `run`
// refuses to start on its errors. Rules whose table the server does not
// have are left to `check --dsn`; rules' databases are looked up as
// Check does without a Databases map. The error is a failure to reach or
// read the server, after which the findings are incomplete; ctx bounds
// it all. log receives progress at debug level; nil discards. Each call
// opens a pool of its own: calls may run concurrently.
func Folding(ctx context.Context, dsn string, rs *rules.RuleSet, log *slog.Logger) ([]Finding, error) {
	srv, err := openServer(dsn, log)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	if err := srv.connect(ctx); err != nil {
		return nil, err
	}
	where := srv.where
	s := &Schema{DB: srv.db, Log: log}
	if err := s.open(ctx); err != nil {
		return nil, fmt.Errorf("MySQL %s: %w", where, err)
	}
	defer s.conn.Close()
	var out []Finding
	for _, r := range rs.Rules() {
		c := &ruleCheck{s: s, r: r}
		t, err := s.ruleTable(ctx, c)
		if err == nil && t != nil {
			c.out = nil // only the collations' findings
			err = s.collations(ctx, c, t)
		}
		if err != nil {
			return out, fmt.Errorf("MySQL %s: rule %q: %w", where, r.Name, err)
		}
		if t != nil {
			out = append(out, c.out...)
		}
	}
	sortFindings(out)
	return out, nil
}
