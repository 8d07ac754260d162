package check

import (
	"slices"
	"strings"
)

// This file reads just enough of a rule's SQL query to name the index
// that would serve it: the tables of its FROM and JOIN clauses with their
// aliases, and the columns it compares with a '?' placeholder or a
// constant. It never changes the query nor builds SQL from it.

type tokKind uint8

const (
	tokIdent tokKind = iota + 1 // a bare or `quoted` name
	tokKeyword
	tokString
	tokNumber
	tokParam // ?
	tokOp    // = <=> < > <= >= != <>
	tokPunct // ( ) , . ;
)

type token struct {
	kind tokKind
	text string // names unquoted, keywords upper-cased
	// pos and end are the byte offsets of the token in the query.
	pos, end int
}

// keywords are the words that end a table reference or are never a
// column name in the positions looked at.
var keywords = map[string]bool{
	"SELECT": true, "FROM": true, "WHERE": true, "JOIN": true, "INNER": true, "LEFT": true, "RIGHT": true,
	"OUTER": true, "CROSS": true, "NATURAL": true, "STRAIGHT_JOIN": true, "ON": true, "USING": true,
	"GROUP": true, "ORDER": true, "BY": true, "HAVING": true, "LIMIT": true, "OFFSET": true, "AND": true,
	"OR": true, "NOT": true, "IN": true, "IS": true, "NULL": true, "BETWEEN": true, "LIKE": true, "AS": true,
	"DISTINCT": true, "UNION": true, "ALL": true, "FORCE": true, "USE": true, "IGNORE": true, "INDEX": true,
	"KEY": true, "FOR": true, "LOCK": true, "SHARE": true, "MODE": true, "UPDATE": true, "WINDOW": true,
	"TRUE": true, "FALSE": true, "XOR": true, "WITH": true, "EXISTS": true, "CASE": true, "WHEN": true,
	"THEN": true, "ELSE": true, "END": true, "DIV": true, "MOD": true, "INTO": true, "PARTITION": true,
}

// tokenize splits SQL into tokens, skipping comments but reading the text
// of MySQL's executable comments (/*! ... */), which the server runs.
func tokenize(sql string) []token {
	var out []token
	for i := 0; i < len(sql); {
		if next, skipped := skipNonToken(sql, i); skipped {
			if next < 0 {
				return out // a comment that does not end
			}
			i = next
			continue
		}
		t, next := readToken(sql, i)
		t.pos, t.end = i, min(next, len(sql))
		out = append(out, t)
		i = next
	}
	return out
}

// skipNonToken skips what at sql[i] is no token: white space, a comment,
// or the opening (with its version number) or end of an executable
// comment, whose content is read. next is -1 for a comment that does not
// end; skipped is false when a token starts at i.
func skipNonToken(sql string, i int) (next int, skipped bool) {
	c := sql[i]
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
		return i + 1, true
	case c == '#', c == '-' && strings.HasPrefix(sql[i:], "--") && (i+2 == len(sql) || sql[i+2] <= ' '):
		for i < len(sql) && sql[i] != '\n' {
			i++
		}
		return i, true
	case c == '/' && strings.HasPrefix(sql[i:], "/*!"):
		i += 3
		for i < len(sql) && sql[i] >= '0' && sql[i] <= '9' {
			i++ // version number
		}
		return i, true
	case c == '/' && strings.HasPrefix(sql[i:], "/*"):
		end := strings.Index(sql[i+2:], "*/")
		if end < 0 {
			return -1, true
		}
		return i + end + 4, true
	case c == '*' && strings.HasPrefix(sql[i:], "*/"):
		return i + 2, true // end of an executable comment
	}
	return i, false
}

// readToken reads the token that starts at sql[i]; next is the index
// after it (past the closing quote of a quoted one).
func readToken(sql string, i int) (t token, next int) {
	c := sql[i]
	j := i + 1
	switch {
	case c == '\'' || c == '"' || c == '`':
		return readQuoted(sql, i)
	case c == '?':
		return token{kind: tokParam, text: "?"}, j
	case c == '<' || c == '>' || c == '=' || c == '!':
		for j < len(sql) && j < i+3 && (sql[j] == '=' || sql[j] == '>') {
			j++
		}
		return token{kind: tokOp, text: sql[i:j]}, j
	case c >= '0' && c <= '9':
		for j < len(sql) && (isWordByte(sql[j]) || sql[j] == '.') {
			j++
		}
		return token{kind: tokNumber, text: sql[i:j]}, j
	case isWordByte(c):
		for j < len(sql) && isWordByte(sql[j]) {
			j++
		}
		w := sql[i:j]
		if up := strings.ToUpper(w); keywords[up] {
			return token{kind: tokKeyword, text: up}, j
		}
		return token{kind: tokIdent, text: w}, j
	}
	return token{kind: tokPunct, text: sql[i:j]}, j
}

// readQuoted reads the string ('...' or "...") or quoted identifier
// (`...`) at sql[i], undoing backslash escapes (not in identifiers) and
// doubled quotes; next is the index after the closing quote.
func readQuoted(sql string, i int) (t token, next int) {
	c := sql[i]
	j := i + 1
	var b strings.Builder
	for j < len(sql) {
		if sql[j] == '\\' && c != '`' && j+1 < len(sql) {
			b.WriteByte(sql[j+1])
			j += 2
			continue
		}
		if sql[j] == c {
			if j+1 < len(sql) && sql[j+1] == c {
				b.WriteByte(c)
				j += 2
				continue
			}
			break
		}
		b.WriteByte(sql[j])
		j++
	}
	kind := tokString
	if c == '`' {
		kind = tokIdent
	}
	return token{kind: kind, text: b.String()}, j + 1
}

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// tableRef is a table of a query's FROM or JOIN clauses.
type tableRef struct {
	schema, name, alias string
}

// condKind orders the columns of a suggested index: equality with a
// placeholder, then with a constant, then one range.
type condKind uint8

const (
	condEqParam condKind = iota + 1
	condEqConst
	condRange
)

// cond is a column the query compares with a placeholder or a constant.
type cond struct {
	qualifier, column string
	kind              condKind
}

// scanned is what scanQuery finds in a query.
type scanned struct {
	tables []tableRef
	conds  []cond
}

// scanQuery reads the tables and the compared columns of a query.
func scanQuery(sql string) scanned {
	toks := tokenList(tokenize(sql))
	s := scanned{tables: toks.tables()}
	toks.conditions(s.addCond)
	return s
}

// tokenList is a query's tokens, with the look-ups scanQuery's steps
// share.
type tokenList []token

// isKw reports whether toks[i] is one of the keywords words.
func (toks tokenList) isKw(i int, words ...string) bool {
	if i < 0 || i >= len(toks) || toks[i].kind != tokKeyword {
		return false
	}
	return slices.Contains(words, toks[i].text)
}

// tables returns the tables named after FROM (a comma-separated list) and
// after JOIN.
func (toks tokenList) tables() []tableRef {
	var refs []tableRef
	for i := 0; i < len(toks); i++ {
		if !toks.isKw(i, "FROM", "JOIN", "STRAIGHT_JOIN") {
			continue
		}
		for j := i + 1; j < len(toks); {
			ref, next, ok := toks.tableAt(j)
			if !ok {
				break
			}
			refs = append(refs, ref)
			j = next
			if j < len(toks) && toks[j].text == "," && toks.isKw(i, "FROM") {
				j++
				continue
			}
			break
		}
	}
	return refs
}

// tableAt reads the table reference at toks[i] ([schema.]name [[AS]
// alias]); next is the index after it.
func (toks tokenList) tableAt(i int) (ref tableRef, next int, ok bool) {
	if toks[i].kind != tokIdent {
		return ref, i, false
	}
	ref.name = toks[i].text
	j := i + 1
	if j+1 < len(toks) && toks[j].text == "." && toks[j+1].kind == tokIdent {
		ref.schema, ref.name = ref.name, toks[j+1].text
		j += 2
	}
	if toks.isKw(j, "AS") {
		j++
	}
	if j < len(toks) && toks[j].kind == tokIdent {
		ref.alias = toks[j].text
		j++
	}
	return ref, j, true
}

// colAt reads the column reference at toks[i] (qual.col, or col; not a
// function call); next is the index after it.
func (toks tokenList) colAt(i int) (qual, col string, next int, ok bool) {
	if i >= len(toks) || toks[i].kind != tokIdent {
		return "", "", i, false
	}
	if i+1 < len(toks) && toks[i+1].text == "(" {
		return "", "", i, false // a function call
	}
	parts := []string{toks[i].text}
	j := i + 1
	for j+1 < len(toks) && toks[j].text == "." && toks[j+1].kind == tokIdent {
		parts = append(parts, toks[j+1].text)
		j += 2
	}
	col = parts[len(parts)-1]
	if len(parts) > 1 {
		qual = parts[len(parts)-2]
	}
	return qual, col, j, true
}

// valueKind reports whether toks[i] is a parameter or a constant (a
// string, a number, a negative number, TRUE or FALSE).
func (toks tokenList) valueKind(i int) (param, constant bool) {
	if i >= len(toks) {
		return false, false
	}
	t := toks[i]
	switch {
	case t.kind == tokParam:
		return true, false
	case t.text == "-" && i+1 < len(toks) && toks[i+1].kind == tokNumber:
		return false, true
	}
	return false, t.kind == tokString || t.kind == tokNumber || (t.kind == tokKeyword && (t.text == "TRUE" || t.text == "FALSE"))
}

// isComparison reports whether toks[i] compares (an operator other than
// != and <>).
func (toks tokenList) isComparison(i int) bool {
	return i < len(toks) && toks[i].kind == tokOp && toks[i].text != "!=" && toks[i].text != "<>"
}

// conditions calls add for each condition column op ? | constant, and the
// mirror forms ? = column, constant = column; eq is true for = , <=> and
// IN.
func (toks tokenList) conditions(add func(qual, col string, eq, param, constant bool)) {
	for i := 0; i < len(toks); i++ {
		qual, col, j, ok := toks.colAt(i)
		if ok && j < len(toks) {
			t := toks[j]
			switch {
			case toks.isComparison(j):
				p, c := toks.valueKind(j + 1)
				add(qual, col, t.text == "=" || t.text == "<=>", p, c)
			case t.kind == tokKeyword && t.text == "IN" && j+1 < len(toks) && toks[j+1].text == "(":
				p, c := toks.valueKind(j + 2)
				add(qual, col, true, p, c)
			case t.kind == tokKeyword && (t.text == "BETWEEN" || t.text == "LIKE"):
				p, c := toks.valueKind(j + 1)
				add(qual, col, false, p, c)
			}
			i = j - 1
			continue
		}
		if p, c := toks.valueKind(i); (p || c) && toks.isComparison(i+1) {
			if qual, col, _, ok := toks.colAt(i + 2); ok {
				add(qual, col, toks[i+1].text == "=" || toks[i+1].text == "<=>", p, c)
			}
		}
	}
}

// addCond records a condition on qual.col compared with a parameter or a
// constant; eq tells equality from a range.
func (s *scanned) addCond(qual, col string, eq, param, constant bool) {
	switch {
	case eq && param:
		s.conds = append(s.conds, cond{qual, col, condEqParam})
	case eq && constant:
		s.conds = append(s.conds, cond{qual, col, condEqConst})
	case param || constant:
		s.conds = append(s.conds, cond{qual, col, condRange})
	}
}

// isSelect reports whether a query reads: SELECT, or WITH ... SELECT,
// possibly in parentheses.
func isSelect(sql string) bool {
	for _, t := range tokenize(sql) {
		if t.text == "(" {
			continue
		}
		return t.kind == tokKeyword && (t.text == "SELECT" || t.text == "WITH")
	}
	return false
}

// indexColumns returns the columns of the index that would serve the
// query's access to the table known in the query as ref (by alias, or
// name): equalities with placeholders, then with constants, then one
// range, each column once. has reports whether the table has a column.
func (s *scanned) indexColumns(ref string, has func(string) bool) []string {
	var out []string
	seen := map[string]bool{}
	ranged := false
	for _, kind := range []condKind{condEqParam, condEqConst, condRange} {
		for _, c := range s.conds {
			if c.kind != kind || seen[strings.ToLower(c.column)] {
				continue
			}
			if c.qualifier != "" && !strings.EqualFold(c.qualifier, ref) {
				continue
			}
			if c.qualifier == "" && !has(c.column) {
				continue
			}
			if kind == condRange {
				if ranged {
					continue
				}
				ranged = true
			}
			seen[strings.ToLower(c.column)] = true
			out = append(out, c.column)
		}
	}
	return out
}

// table returns the table the query names as ref (an alias or a name).
func (s *scanned) table(ref string) (tableRef, bool) {
	for _, t := range s.tables {
		if t.alias == ref {
			return t, true
		}
	}
	for _, t := range s.tables {
		if t.alias == "" && t.name == ref {
			return t, true
		}
	}
	return tableRef{}, false
}

// operand is a column, a '?' or a constant, with the collation the query
// names for it: COLLATE name after it, "binary" for BINARY before it,
// CAST(... AS BINARY) and CONVERT(... USING binary) around it.
type operand struct {
	column    string // "" for a placeholder or constant
	qualifier string // the table (or alias) the column is written with
	coll      string // lower case; "" when none is named
}

// operandAt reads an operand at toks[i]; ok is false when there is none.
// It reads each token at most once: CAST and CONVERT take a plain
// operand, and their end is read only in the forms that compare bytes.
func operandAt(toks []token, i int) (o operand, next int, ok bool) {
	binary := false
	for i < len(toks) && toks[i].kind == tokIdent && strings.EqualFold(toks[i].text, "BINARY") {
		binary, i = true, i+1
	}
	if i >= len(toks) {
		return operand{}, i, false
	}
	t := toks[i]
	fn := strings.ToUpper(t.text)
	switch {
	case t.kind == tokIdent && (fn == "CAST" || fn == "CONVERT") && i+1 < len(toks) && toks[i+1].text == "(":
		inner, j, ok := plainOperand(toks, i+2)
		if !ok {
			return operand{}, i, false
		}
		o, next = inner, j
		// CAST(x AS BINARY), CAST(x AS BINARY(n)), CONVERT(x USING binary)
		if j+1 < len(toks) && strings.EqualFold(toks[j+1].text, "BINARY") &&
			((fn == "CAST" && toks[j].text == "AS") || (fn == "CONVERT" && toks[j].text == "USING")) {
			k := j + 2
			if k+2 < len(toks) && toks[k].text == "(" && toks[k+1].kind == tokNumber && toks[k+2].text == ")" {
				k += 3
			}
			if k < len(toks) && toks[k].text == ")" {
				o.coll, next = binaryCollation, k+1
			}
		}
	default:
		o, next, ok = plainOperand(toks, i)
		if !ok {
			return operand{}, i, false
		}
	}
	if next+1 < len(toks) && toks[next].kind == tokIdent && strings.EqualFold(toks[next].text, "COLLATE") &&
		(toks[next+1].kind == tokIdent || toks[next+1].kind == tokString) {
		o.coll = strings.ToLower(toks[next+1].text)
		next += 2
	}
	if binary {
		o.coll = binaryCollation
	}
	return o, next, true
}

// plainOperand reads a '?', a constant or a (qualified) column at
// toks[i], with no collation.
func plainOperand(toks []token, i int) (o operand, next int, ok bool) {
	if i >= len(toks) {
		return operand{}, i, false
	}
	switch t := toks[i]; {
	case t.kind == tokParam || t.kind == tokString || t.kind == tokNumber:
		return operand{}, i + 1, true
	case t.kind == tokIdent && !(i+1 < len(toks) && toks[i+1].text == "("):
		o.column = t.text
		next = i + 1
		for next+1 < len(toks) && toks[next].text == "." && toks[next+1].kind == tokIdent {
			o.qualifier, o.column = o.column, toks[next+1].text
			next += 2
		}
		return o, next, true
	}
	return operand{}, i, false
}

// explicitCollations returns, by lower-case column name, the collations
// a query names where it reads a column or compares it with = or <=>:
// "tag COLLATE x", "tag = ? COLLATE x", "? COLLATE x = tag", and
// "binary" for BINARY, CAST(... AS BINARY) and CONVERT(... USING binary)
// on either side. It reads the text only; the server is asked what each
// collation folds.
func explicitCollations(sql string) map[string][]string {
	if sql == "" {
		return nil
	}
	toks := tokenize(sql)
	out := map[string][]string{}
	add := func(col, coll string) {
		if col == "" || coll == "" {
			return
		}
		k := strings.ToLower(col)
		for _, c := range out[k] {
			if c == coll {
				return
			}
		}
		out[k] = append(out[k], coll)
	}
	for i := 0; i < len(toks); i++ {
		left, j, ok := operandAt(toks, i)
		if !ok {
			continue
		}
		add(left.column, left.coll)
		if j < len(toks) && toks[j].kind == tokOp && (toks[j].text == "=" || toks[j].text == "<=>") {
			if right, _, ok := operandAt(toks, j+1); ok {
				add(left.column, right.coll)
				add(right.column, left.coll)
			}
		}
	}
	return out
}

// collapses reports whether a query makes one row of values its
// comparisons find equal: DISTINCT, GROUP BY, or UNION without ALL.
func collapses(sql string) bool {
	toks := tokenize(sql)
	for i, t := range toks {
		if t.kind != tokKeyword {
			continue
		}
		switch t.text {
		case "DISTINCT":
			return true
		case "GROUP":
			if i+1 < len(toks) && toks[i+1].text == "BY" {
				return true
			}
		case "UNION":
			if i+1 >= len(toks) || toks[i+1].text != "ALL" {
				return true
			}
		}
	}
	return false
}

// colName is a column a query names, with the table qualifier it is
// written with ("" when none).
type colName struct {
	qualifier, name string
}

// selectItem is one expression of a query's select list.
type selectItem struct {
	// text is the item as written, for messages.
	text string
	// star is true for * and q.*, which qualifies it.
	star          bool
	starQualifier string
	// column is set when the item is a column alone: possibly qualified,
	// under BINARY, COLLATE, CAST(... AS BINARY) or CONVERT(... USING
	// binary), with an alias or not.
	column *colName
	// refs are the columns an expression reads (the column itself for a
	// column alone), and may hold words that are no column (INTERVAL 1
	// DAY); opaque is true, and refs nil, when it holds a subquery.
	refs   []colName
	opaque bool
	// count is true when the item calls COUNT at any depth.
	count bool
}

// selectList is what selectOf reads of a query's main SELECT.
type selectList struct {
	items []selectItem
	// groups names the GROUP BY, HAVING, UNION, EXCEPT or INTERSECT of the
	// main SELECT that can make it return other than one row; "" when none.
	groups string
}

// selectModifiers may follow SELECT before the select list.
var selectModifiers = map[string]bool{
	"ALL": true, "DISTINCT": true, "DISTINCTROW": true, "HIGH_PRIORITY": true, "STRAIGHT_JOIN": true,
	"SQL_SMALL_RESULT": true, "SQL_BIG_RESULT": true, "SQL_BUFFER_RESULT": true, "SQL_CACHE": true,
	"SQL_NO_CACHE": true, "SQL_CALC_FOUND_ROWS": true,
}

// selectEnd are the words that end a select list at its own depth.
var selectEnd = map[string]bool{
	"FROM": true, "INTO": true, "WHERE": true, "GROUP": true, "HAVING": true, "WINDOW": true,
	"ORDER": true, "LIMIT": true, "FOR": true, "LOCK": true, "UNION": true, "EXCEPT": true, "INTERSECT": true,
}

// selectOf reads the select list of a query's main SELECT (after any WITH
// clause; the first of a UNION), and what follows it at its depth; ok is
// false when there is no SELECT.
func selectOf(sql string) (sel selectList, ok bool) {
	toks := tokenList(tokenize(sql))
	start, base, ok := toks.mainSelect()
	if !ok {
		return sel, false
	}
	i := start + 1
	for i < len(toks) && selectModifiers[toks.upper(i)] && i+1 < len(toks) && toks[i+1].text != "," {
		i++
	}
	items, i, rel := toks.selectItems(i)
	for _, item := range items {
		sel.items = append(sel.items, readItem(sql, item))
	}
	sel.groups = toks.grouping(i, base+rel, base)
	return sel, true
}

// upper returns toks[i] in upper case when it is a keyword or an
// identifier, else "".
func (toks tokenList) upper(i int) string {
	if i < 0 || i >= len(toks) || (toks[i].kind != tokKeyword && toks[i].kind != tokIdent) {
		return ""
	}
	return strings.ToUpper(toks[i].text)
}

// mainSelect finds the main SELECT: the first one outside the WITH
// clause's bodies. start is its index, base the parentheses open before
// it.
func (toks tokenList) mainSelect() (start, base int, ok bool) {
	start, depth, with := -1, 0, false
	for i, t := range toks {
		switch {
		case t.text == "(" && t.kind == tokPunct:
			depth++
		case t.text == ")" && t.kind == tokPunct:
			depth--
		case toks.upper(i) == "WITH" && start < 0 && i == 0:
			with = true
		case toks.upper(i) == "SELECT" && (!with || depth == 0):
			start = i
		}
		if start >= 0 {
			break
		}
	}
	if start < 0 {
		return 0, 0, false
	}
	for _, t := range toks[:start] {
		switch t.text {
		case "(":
			base++
		case ")":
			base--
		}
	}
	return start, base, true
}

// selectItems splits the select list that starts at toks[i] into its
// items at commas of the list's own depth, up to the keyword that ends it
// (selectEnd), a ';' or the ')' of a parenthesized SELECT. next is the
// index after the list, rel the parentheses open there relative to it.
func (toks tokenList) selectItems(i int) (items [][]token, next, rel int) {
	var item []token
	flush := func() {
		if len(item) > 0 {
			items = append(items, item)
		}
		item = nil
	}
	for ; i < len(toks); i++ {
		t := toks[i]
		if rel == 0 && (t.kind == tokKeyword || t.kind == tokIdent) && selectEnd[toks.upper(i)] {
			break
		}
		if t.kind == tokPunct {
			switch t.text {
			case "(":
				rel++
			case ")":
				rel--
			case ";":
				if rel == 0 {
					i = len(toks)
				}
			case ",":
				if rel == 0 {
					flush()
					continue
				}
			}
		}
		if rel < 0 { // the ')' of a parenthesized SELECT, read again below
			rel = 0
			break
		}
		if i >= len(toks) {
			break
		}
		item = append(item, t)
	}
	flush()
	return items, i, rel
}

// grouping returns the first UNION, EXCEPT, INTERSECT, GROUP BY or HAVING
// from toks[i] on, at the list's depth (depth, base) or, for a UNION of
// parenthesized SELECTs, outside them; "" when there is none.
func (toks tokenList) grouping(i, depth, base int) string {
	for ; i < len(toks); i++ {
		switch t := toks[i]; {
		case t.kind == tokPunct && t.text == "(":
			depth++
		case t.kind == tokPunct && t.text == ")":
			depth--
		case depth <= base && (toks.upper(i) == "UNION" || toks.upper(i) == "EXCEPT" || toks.upper(i) == "INTERSECT"):
			return toks.upper(i)
		case depth == base && (toks.upper(i) == "GROUP" && toks.upper(i+1) == "BY" || toks.upper(i) == "HAVING"):
			if toks.upper(i) == "GROUP" {
				return "GROUP BY"
			}
			return "HAVING"
		}
	}
	return ""
}

// readItem reads one select list item, toks of sql.
func readItem(sql string, toks []token) selectItem {
	it := selectItem{text: sql[toks[0].pos:toks[len(toks)-1].end]}
	isWord := func(t token, w string) bool {
		return (t.kind == tokKeyword || t.kind == tokIdent) && strings.EqualFold(t.text, w)
	}
	// An alias: AS name, or a name after what ends an expression.
	n := len(toks)
	if n >= 3 && isWord(toks[n-2], "AS") && (toks[n-1].kind == tokIdent || toks[n-1].kind == tokString) {
		n -= 2
	}
	body := toks[:n]
	switch {
	case len(body) == 1 && body[0].text == "*" && body[0].kind == tokPunct:
		it.star = true
		return it
	case len(body) == 3 && body[2].text == "*" && body[1].text == "." && body[0].kind == tokIdent:
		it.star, it.starQualifier = true, body[0].text
		return it
	}
	if o, next, ok := operandAt(body, 0); ok && o.column != "" &&
		(next == len(body) || next == len(body)-1 && body[next].kind == tokIdent && !isWord(body[next], "COLLATE")) {
		c := colName{qualifier: o.qualifier, name: o.column}
		it.column, it.refs = &c, []colName{c}
		return it
	}
	// An implicit alias after an expression: "CONCAT(a, b) ab".
	if len(body) >= 2 && body[len(body)-1].kind == tokIdent {
		if p := body[len(body)-2]; p.text == ")" || p.kind == tokString || p.kind == tokNumber {
			body = body[:len(body)-1]
		}
	}
	depth, typeDepth := 0, -1 // typeDepth: inside CAST's "AS type" up to its ')'
	for i := 0; i < len(body); i++ {
		t := body[i]
		switch {
		case t.kind == tokPunct && t.text == "(":
			depth++
			continue
		case t.kind == tokPunct && t.text == ")":
			if depth == typeDepth {
				typeDepth = -1
			}
			depth--
			continue
		case typeDepth >= 0:
			continue
		case isWord(t, "SELECT"):
			it.opaque = true
		case isWord(t, "AS") && depth > 0:
			typeDepth = depth // CAST(x AS type)
		case (isWord(t, "USING") || isWord(t, "COLLATE")) && i+1 < len(body):
			i++ // a character set or collation name
		case t.kind == tokIdent && i+1 < len(body) && body[i+1].text == "(":
			if strings.EqualFold(t.text, "COUNT") {
				it.count = true
			}
		case t.kind == tokIdent && !(i > 0 && body[i-1].text == "."):
			c := colName{name: t.text}
			for i+2 < len(body) && body[i+1].text == "." && body[i+2].kind == tokIdent {
				c.qualifier, c.name = c.name, body[i+2].text
				i += 2
			}
			it.refs = append(it.refs, c)
		}
	}
	if it.opaque {
		it.refs = nil // a subquery's names are its own
	}
	return it
}
