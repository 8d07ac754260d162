package rules

import (
	"fmt"
	"slices"
	"strings"
)

// MaxEntityValueBytes bounds one value given for an entity (EntityRow):
// 64 KiB, far beyond any key column (a key over MaxKeyLen bytes is hashed
// anyway) and small enough that a mistyped argument cannot make a huge
// key or query.
const MaxEntityValueBytes = 64 << 10

// EntityColumns returns the columns that name one entity of r: its key's
// placeholder columns, each once in order of first appearance, then the
// columns of its load or recount query's args that are not among them.
func (r *Rule) EntityColumns() []string {
	var cols []string
	add := func(c string) {
		if !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	for _, c := range r.Key.Columns() {
		add(c)
	}
	for _, c := range r.Args {
		add(c)
	}
	return cols
}

// EntityRow turns "column=value" arguments naming one entity of r into
// the row image Plan would render r's key and args from. Each of r's
// EntityColumns must be given once and nothing else; a value is taken as
// its text, with the kind a change event gives it: an integer when it is
// written as one in canonical form ("42", "-7", not "007" or "+1"), a
// string otherwise (the kind decides only how it is bound to r's query;
// the key renders the same text either way). Values are escaped in keys
// exactly as row values are, so any byte may be given; a value longer
// than MaxEntityValueBytes is refused. The error names the argument and
// what is wrong.
func (r *Rule) EntityRow(args []string) (Row, error) {
	want := r.EntityColumns()
	row := make(Row, 0, len(want))
	for i, a := range args {
		col, val, ok := strings.Cut(a, "=")
		switch {
		case !ok || col == "":
			return nil, fmt.Errorf("rule %q: argument %d %.40q: want column=value", r.Name, i+1, a)
		case !slices.Contains(want, col):
			return nil, fmt.Errorf("rule %q: argument %d: %q is not a column of its key or query arguments (%s)", r.Name, i+1, col, strings.Join(want, ", "))
		case len(val) > MaxEntityValueBytes:
			return nil, fmt.Errorf("rule %q: argument %d: the value of %q is %d bytes, the limit is %d", r.Name, i+1, col, len(val), MaxEntityValueBytes)
		}
		if _, dup := row.Get(col); dup {
			return nil, fmt.Errorf("rule %q: argument %d: %q is given twice", r.Name, i+1, col)
		}
		kind := KindString
		if canonicalInt(Value{Kind: KindInt, Text: val}) {
			kind = KindInt
		}
		row = append(row, Column{Name: col, Value: Value{Kind: kind, Text: val}})
	}
	var missing []string
	for _, c := range want {
		if _, ok := row.Get(c); !ok {
			missing = append(missing, c+"=")
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("rule %q: give %s", r.Name, strings.Join(missing, " "))
	}
	return row, nil
}

// EntityOps returns the ops that invalidate the entity of r whose row
// image is row (see EntityRow), on exactly the keys Plan renders for a
// change of that row, whatever r's `when`, `on` and `columns` say:
//
//   - bump: the bumps Plan makes (one per copy, with the copies' keys of
//     earlier releases; the entity's evidence bit for a rule with
//     evidence);
//   - set and count: an OpSetDelete of the item at the key (a missing set
//     or counter is always correct: readers load or recount it), with
//     Args bound from row when r has a query. A counter lives at
//     itemformat.CounterKey of the key and its table's current generation
//     (Rule.Generation): the caller moves the op there.
//
// A key longer than MaxKeyLen gets its hashed form and, as Plan adds, an
// op (Legacy) on the key releases before the "%#" mark used. The ops'
// Source is zero. It is safe for concurrent use.
func (r *Rule) EntityOps(row Row) ([]Op, error) {
	p := planner{sc: &planScratch{}, ev: &Event{Database: r.Database, Table: r.Table}}
	k, null, err := p.key(r, row, imageAfter)
	switch {
	case err != nil:
		return nil, err
	case null:
		return nil, fmt.Errorf("rule %q: a key column is NULL", r.Name)
	}
	if r.Kind == BumpRule {
		p.bump(r, k, row)
	} else if err := p.emit(OpSetDelete, r, k, span{}, 0, row, imageAfter); err != nil {
		return nil, err
	}
	return p.finish(), nil
}
