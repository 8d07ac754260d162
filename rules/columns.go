package rules

import "slices"

// ColumnsRead returns, sorted and without repeats, every column some rule
// of the set reads from a row image: the placeholders of its key and
// member templates, its `columns` list, its query args and the columns its
// `when` predicate names. A decoder may leave every other column out of
// the rows it builds (decode.Decoder.Keep): Plan gives the same ops.
func (rs *RuleSet) ColumnsRead() []string {
	var cols []string
	for _, r := range rs.rules {
		cols = r.columnsRead(cols)
	}
	slices.Sort(cols)
	return slices.Compact(cols)
}

// columnsRead appends the columns r reads.
func (r *Rule) columnsRead(dst []string) []string {
	for _, t := range []*Template{r.Key, r.Member} {
		if t != nil {
			dst = append(dst, t.Columns()...)
		}
	}
	dst = append(dst, r.Columns...)
	dst = append(dst, r.Args...)
	if r.pred != nil {
		dst = r.pred.root.columns(dst)
	}
	return dst
}

// columns appends the columns the predicate tree n names.
func (n *pnode) columns(dst []string) []string {
	if n == nil {
		return dst
	}
	for _, o := range append([]operand{n.a, n.b}, n.list...) {
		if o.isCol {
			dst = append(dst, o.column)
		}
	}
	dst = n.l.columns(dst)
	return n.r.columns(dst)
}
