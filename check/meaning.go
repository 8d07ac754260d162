package check

import (
	"cmp"
	"context"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// This file checks what a rule's queries return against what the daemon
// and verify make of it (docs/rules.md):
//
//   - a set's load: the first column of each row is a member, compared
//     byte for byte with the members that changes add, which are the
//     member template rendered from the row; other columns are ignored;
//   - a counter's recount: one row of one column, the count;
//   - a keys query: one column per distinct placeholder of the key, in
//     order, from which verify builds each key.
//
// A select list is compared with the rule's columns only where the query
// is plain enough to tell what each column reads: one SELECT (no
// subquery, WITH or UNION), every table of it on the server, and the
// column one of the rule's table. A column of another (joined) table may
// hold the same values, so it is never judged.

// queryShape is a query's main select list, with the tables the query
// reads when it is plain enough to resolve its columns.
type queryShape struct {
	sel selectList
	// plain is true when every column reference of sel can be resolved
	// through tables.
	plain  bool
	tables []tableRef
	s      *Schema
	// n is the number of columns the query returns, -1 when a star's
	// table is unknown; names are the items as written, a table's columns
	// for a star.
	n     int
	names []string
}

// shape reads q's select list and counts its columns; nil when it has
// none.
func (s *Schema) shape(ctx context.Context, q string) (*queryShape, error) {
	sel, ok := selectOf(q)
	if !ok || len(sel.items) == 0 {
		return nil, nil
	}
	qs := &queryShape{sel: sel, s: s}
	selects := 0
	for _, t := range tokenize(q) {
		if t.kind == tokKeyword && t.text == "SELECT" {
			selects++
		}
	}
	sc := scanQuery(q)
	qs.tables = sc.tables
	qs.plain = selects == 1 && len(sc.tables) > 0
	for _, ref := range sc.tables {
		t, err := s.table(ctx, cmp.Or(ref.schema, s.current), ref.name)
		if err != nil {
			return nil, err
		}
		if t == nil {
			qs.plain = false
		}
	}
	var err error
	if qs.n, qs.names, err = qs.columns(ctx); err != nil {
		return nil, err
	}
	return qs, nil
}

// lookup returns the table a query's reference (a table name or alias)
// stands for; nil when unknown.
func (qs *queryShape) lookup(ctx context.Context, ref tableRef) (*table, error) {
	return qs.s.table(ctx, cmp.Or(ref.schema, qs.s.current), ref.name)
}

// resolve returns the table and the column a column reference reads; nil
// when the query is not plain or the reference names no single column of
// its tables.
func (qs *queryShape) resolve(ctx context.Context, c colName) (*table, *column, error) {
	if !qs.plain {
		return nil, nil, nil
	}
	var found *table
	var col *column
	for _, ref := range qs.tables {
		if c.qualifier != "" && c.qualifier != ref.alias && !(ref.alias == "" && strings.EqualFold(c.qualifier, ref.name)) {
			continue
		}
		t, err := qs.lookup(ctx, ref)
		if err != nil {
			return nil, nil, err
		}
		name := foldColumn(t, c.name) // MySQL column names ignore case
		if name == "" {
			continue
		}
		if found != nil && found != t {
			return nil, nil, nil // ambiguous: left to the server
		}
		found, col = t, t.column(name)
	}
	return found, col, nil
}

// columns returns the number of columns the select list returns and
// their names (the items as written, a table's columns for a star); n is
// -1 when a star's table is unknown.
func (qs *queryShape) columns(ctx context.Context) (n int, names []string, err error) {
	for _, it := range qs.sel.items {
		if !it.star {
			n++
			names = append(names, it.text)
			continue
		}
		if !qs.plain {
			return -1, nil, nil
		}
		matched := false
		for _, ref := range qs.tables {
			if it.starQualifier != "" && it.starQualifier != ref.alias && !(ref.alias == "" && strings.EqualFold(it.starQualifier, ref.name)) {
				continue
			}
			t, err := qs.lookup(ctx, ref)
			if err != nil {
				return 0, nil, err
			}
			matched = true
			n += len(t.columns)
			names = append(names, t.names()...)
		}
		if !matched {
			return -1, nil, nil
		}
	}
	return n, names, nil
}

// first returns the column the select list's first column is, when it is
// a column alone (or the first column of a star) of a known table.
func (qs *queryShape) first(ctx context.Context) (*table, *column, error) {
	it := qs.sel.items[0]
	switch {
	case it.column != nil:
		return qs.resolve(ctx, *it.column)
	case it.star && qs.plain:
		for _, ref := range qs.tables {
			if it.starQualifier == "" || it.starQualifier == ref.alias || (ref.alias == "" && strings.EqualFold(it.starQualifier, ref.name)) {
				t, err := qs.lookup(ctx, ref)
				if err != nil || t == nil {
					return nil, nil, err
				}
				return t, t.columns[0], nil
			}
		}
	}
	return nil, nil, nil
}

// loadMeaning checks that a set's load returns the rule's members: one
// column, the member template's column (or an expression reading every
// column of the template).
func (s *Schema) loadMeaning(ctx context.Context, c *ruleCheck, t *table, qs *queryShape) error {
	r := c.r
	field := kindField(r, "load")
	n, names := qs.n, qs.names
	if n > 1 {
		c.add(field, Error, "load returns %d columns (%s): the daemon makes a member of each row's first column alone and ignores the rest; "+
			"select one column, the member %q (for a member built from several columns, one expression such as CONCAT(a, ':', b))",
			n, strings.Join(names, ", "), r.Member.String())
	}
	if t == nil || r.Member == nil {
		return nil
	}
	member := r.Member.String()
	bare, isBare := r.Member.Bare()
	ft, fc, err := qs.first(ctx)
	if err != nil {
		return err
	}
	if fc != nil {
		if ft != t {
			return nil // another table's column may hold the same values
		}
		switch {
		case isBare && !strings.EqualFold(fc.Name, bare):
			c.add(field, Error, "load selects column %s of %s as the member, but member %q is column %s: the loaded set would hold %s values while changes add and remove %s values",
				fc.Name, t.name, member, bare, fc.Name, bare)
		case !isBare:
			c.add(field, Error, "load selects column %s of %s alone, but member %q is rendered from %s with literal text or several columns: no loaded member would equal one a change adds; "+
				"select the member as one expression (CONCAT of its columns and text)",
				fc.Name, t.name, member, strings.Join(r.Member.DistinctColumns(), ", "))
		}
		return nil
	}
	it := qs.sel.items[0]
	if it.star || it.opaque || !qs.plain || len(it.refs) == 0 {
		return nil
	}
	read := map[string]bool{}
	for _, ref := range it.refs {
		rt, rc, err := qs.resolve(ctx, ref)
		if err != nil {
			return err
		}
		if rt != t || rc == nil {
			return nil // reads another table, or a word that is no column
		}
		read[strings.ToLower(rc.Name)] = true
	}
	var missing []string
	for _, col := range r.Member.DistinctColumns() {
		if !read[strings.ToLower(col)] {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		c.add(field, Error, "load's member %s does not read %s, but member %q is rendered from it: no loaded member would equal one a change adds",
			it.text, strings.Join(missing, ", "), member)
	}
	return nil
}

// recountMeaning checks that a counter's recount returns one row of one
// column, a COUNT.
func recountMeaning(c *ruleCheck, qs *queryShape) {
	field := kindField(c.r, "recount")
	n, names := qs.n, qs.names
	const want = "the daemon stores the one integer of its one row as the counter: SELECT COUNT(*) FROM ... WHERE ... over the rows the rule counts"
	switch {
	case n > 1:
		c.add(field, Error, "recount returns %d columns (%s), not one count: %s", n, strings.Join(names, ", "), want)
	case n == 1 && !qs.sel.items[0].count:
		c.add(field, Error, "recount returns %s, not a count: %s (a key with no row, or several, fails the recount)", qs.sel.items[0].text, want)
	case qs.sel.groups != "":
		c.add(field, Error, "recount has %s at its top, so it can return no row (a key with nothing to count) or several, not one count: %s", qs.sel.groups, want)
	}
}

// keysMeaning checks that a keys query returns the key's distinct
// placeholder columns, in order.
func (s *Schema) keysMeaning(ctx context.Context, c *ruleCheck, t *table) error {
	r := c.r
	if r.Key == nil {
		return nil
	}
	field := kindField(r, "keys")
	qs, err := s.shape(ctx, r.Keys)
	if qs == nil {
		return err
	}
	want := r.Key.DistinctColumns()
	n, names := qs.n, qs.names
	if n >= 0 && n != len(want) {
		c.add(field, Error, "keys returns %d column(s) (%s), but verify reads one per placeholder of key %q, in order: %d (%s)",
			n, strings.Join(names, ", "), r.Key.String(), len(want), strings.Join(want, ", "))
		return nil
	}
	if t == nil {
		return nil
	}
	for i, it := range qs.sel.items {
		if it.column == nil || i >= len(want) {
			continue
		}
		ct, cl, err := qs.resolve(ctx, *it.column)
		if err != nil {
			return err
		}
		if ct == t && cl != nil && !strings.EqualFold(cl.Name, want[i]) {
			c.add(field, Error, "keys column %d is %s of %s, but placeholder %d of key %q is {%s}: verify would build the keys from %s values",
				i+1, cl.Name, t.name, i+1, r.Key.String(), want[i], cl.Name)
		}
	}
	return nil
}

// meaning runs the check of what the rule's load or recount query
// returns.
func (s *Schema) meaning(ctx context.Context, c *ruleCheck, t *table) error {
	qs, err := s.shape(ctx, c.r.Query)
	if qs == nil {
		return err
	}
	if c.r.Kind == rules.SetRule {
		return s.loadMeaning(ctx, c, t, qs)
	}
	recountMeaning(c, qs)
	return nil
}
