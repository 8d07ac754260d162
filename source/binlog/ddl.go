package binlog

import "strings"

// statement is what a query event means to the stream.
type statement struct {
	// kind is the statement's first keyword in upper case: "BEGIN",
	// "COMMIT", "ROLLBACK", "ALTER", "CREATE", "DROP", "RENAME",
	// "TRUNCATE", or another word.
	kind string
	// tables are the tables an ALTER/CREATE/DROP/RENAME/TRUNCATE TABLE
	// names (a default database filled in); nil when the statement names
	// no table or could not be read (parsed false).
	tables []tableKey
	// parsed is false for a DDL statement whose tables could not be read:
	// every cached table is then forgotten.
	parsed bool
}

// changesColumns reports whether the statement may change some table's
// columns.
func (s statement) changesColumns() bool {
	switch s.kind {
	case "ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE":
		return true
	}
	return false
}

// parseStatement reads the head of a query event's statement; defaultDB
// is the event's database, for table names without one.
func parseStatement(query, defaultDB string) statement {
	lx := lexer{s: query}
	first, _ := lx.next()
	st := statement{kind: strings.ToUpper(first)}
	switch st.kind {
	case "TRUNCATE":
		lx.skipWords("TABLE")
		st.tables, st.parsed = lx.tableList(defaultDB, "", 1)
	case "ALTER":
		if lx.skipTo("TABLE") {
			st.tables, st.parsed = lx.tableList(defaultDB, "", 1)
		}
	case "CREATE":
		if lx.skipTo("TABLE") {
			lx.skipWords("IF", "NOT", "EXISTS")
			st.tables, st.parsed = lx.tableList(defaultDB, "", 1)
		} else {
			st.parsed = true // CREATE DATABASE, INDEX, VIEW...: no table's columns change
		}
	case "DROP":
		if lx.skipTo("TABLE") {
			lx.skipWords("IF", "EXISTS")
			st.tables, st.parsed = lx.tableList(defaultDB, "", 0)
		}
	case "RENAME":
		if lx.skipTo("TABLE") {
			st.tables, st.parsed = lx.tableList(defaultDB, "TO", 0)
		}
	}
	return st
}

// lexer reads words and identifiers of a statement, skipping spaces and
// comments.
type lexer struct {
	s string
	i int
}

// next returns the next token: a word, a backquoted identifier's name
// (quoted true), or one other byte; "" at the end.
func (lx *lexer) next() (tok string, quoted bool) {
	lx.space()
	s, i := lx.s, lx.i
	if i >= len(s) {
		return "", false
	}
	if s[i] == '`' {
		var b strings.Builder
		for j := i + 1; j < len(s); j++ {
			if s[j] != '`' {
				b.WriteByte(s[j])
				continue
			}
			if j+1 < len(s) && s[j+1] == '`' {
				b.WriteByte('`')
				j++
				continue
			}
			lx.i = j + 1
			return b.String(), true
		}
		lx.i = len(s)
		return "", false // unclosed: the end
	}
	j := i
	for j < len(s) && isWordByte(s[j]) {
		j++
	}
	if j == i {
		j++
	}
	lx.i = j
	return s[i:j], false
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}

// space skips spaces and comments (/* */, -- and #).
func (lx *lexer) space() {
	s := lx.s
	for lx.i < len(s) {
		switch c := s[lx.i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			lx.i++
		case c == '#' || (c == '-' && strings.HasPrefix(s[lx.i:], "-- ")):
			end := strings.IndexByte(s[lx.i:], '\n')
			if end < 0 {
				lx.i = len(s)
				return
			}
			lx.i += end + 1
		case c == '/' && strings.HasPrefix(s[lx.i:], "/*"):
			end := strings.Index(s[lx.i+2:], "*/")
			if end < 0 {
				lx.i = len(s)
				return
			}
			lx.i += end + 4
		default:
			return
		}
	}
}

// skipTo consumes tokens up to and including the word want (its first
// six tokens only: ALTER ONLINE IGNORE TABLE, CREATE OR REPLACE
// TEMPORARY TABLE) and reports whether it was found.
func (lx *lexer) skipTo(want string) bool {
	for range 6 {
		tok, quoted := lx.next()
		if tok == "" && !quoted {
			return false
		}
		if !quoted && strings.EqualFold(tok, want) {
			return true
		}
	}
	return false
}

// skipWords consumes the words, in order, when they come next.
func (lx *lexer) skipWords(words ...string) {
	save := lx.i
	for _, w := range words {
		tok, quoted := lx.next()
		if quoted || !strings.EqualFold(tok, w) {
			lx.i = save
			return
		}
	}
}

// tableList reads table names: [db.]name, separated by ',' or by the
// word sep (RENAME's TO), up to max names (0: no bound).
func (lx *lexer) tableList(defaultDB, sep string, max int) ([]tableKey, bool) {
	var out []tableKey
	for {
		k, ok := lx.tableName(defaultDB)
		if !ok {
			return nil, false
		}
		out = append(out, k)
		if max > 0 && len(out) == max {
			return out, true
		}
		save := lx.i
		tok, quoted := lx.next()
		if quoted || !(tok == "," || (sep != "" && strings.EqualFold(tok, sep))) {
			lx.i = save
			return out, true
		}
	}
}

// tableName reads [db.]name.
func (lx *lexer) tableName(defaultDB string) (tableKey, bool) {
	first, quoted := lx.next()
	if first == "" || (!quoted && !isWordByte(first[0])) {
		return tableKey{}, false
	}
	save := lx.i
	if dot, q := lx.next(); dot == "." && !q {
		second, quoted := lx.next()
		if second == "" || (!quoted && !isWordByte(second[0])) {
			return tableKey{}, false
		}
		return tableKey{first, second}, true
	}
	lx.i = save
	return tableKey{defaultDB, first}, true
}
