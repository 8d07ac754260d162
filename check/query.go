package check

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"
)

// query checks a set's load or a counter's recount query: it reads,
// prepares with as many parameters as args names, returns what the
// daemon reads of it (meaning.go), and uses an index.
func (s *Schema) query(ctx context.Context, c *ruleCheck, t *table) error {
	r := c.r
	field, name := queryField(r)
	if !isSelect(r.Query) {
		c.add(field, Error, "%s must be a SELECT: the daemon runs it on every miss", name)
		return nil
	}
	n, ok, err := s.prepare(ctx, c, field, name, r.Query)
	if err != nil || !ok {
		return err
	}
	if err := s.meaning(ctx, c, t); err != nil {
		return err
	}
	if n != len(r.Args) {
		from := "args name"
		if _, explicit := r.At[kindField(r, "args")]; !explicit {
			from = "the key's placeholders (the default args) are"
		}
		why := ""
		if strings.Contains(r.Query, "/*!") {
			why = "; a '?' inside an executable comment /*! */ counts on the server"
		}
		c.add(field, Error, "%s takes %d parameter(s) on the server but %s %d column(s) %v%s",
			name, n, from, len(r.Args), r.Args, why)
		return nil
	}
	return s.explain(ctx, c, t, field, name)
}

// keysQuery checks that a keys query prepares without parameters and
// returns the key's columns.
func (s *Schema) keysQuery(ctx context.Context, c *ruleCheck, t *table) error {
	field := kindField(c.r, "keys")
	if !isSelect(c.r.Keys) {
		c.add(field, Error, "keys must be a SELECT: verify runs it")
		return nil
	}
	n, ok, err := s.prepare(ctx, c, field, "keys", c.r.Keys)
	if err != nil || !ok {
		return err
	}
	if n != 0 {
		c.add(field, Error, "keys takes %d parameter(s) on the server; it must take none", n)
	}
	return s.keysMeaning(ctx, c, t)
}

// unknownColumn reads the column of MySQL's error 1054.
var unknownColumn = regexp.MustCompile(`Unknown column '([^']+)'`)

// prepare prepares q on the server and returns its number of parameters;
// ok is false (with a finding) when the server refuses it.
func (s *Schema) prepare(ctx context.Context, c *ruleCheck, field, name, q string) (n int, ok bool, err error) {
	perr := s.conn.Raw(func(dc any) error {
		p, isPreparer := dc.(driver.ConnPrepareContext)
		if !isPreparer {
			return errors.New("the MySQL driver cannot prepare statements")
		}
		st, err := p.PrepareContext(ctx, q)
		if err != nil {
			return err
		}
		n = st.NumInput()
		return st.Close()
	})
	var me *mysql.MySQLError
	if !errors.As(perr, &me) {
		return n, perr == nil, perr
	}
	hint := ""
	line, col := c.at(field)
	if m := unknownColumn.FindStringSubmatch(me.Message); m != nil {
		unknown := m[1][strings.LastIndexByte(m[1], '.')+1:]
		var names []string
		for _, ref := range scanQuery(q).tables {
			t, err := s.table(ctx, cmp.Or(ref.schema, s.current), ref.name)
			if err != nil {
				return n, false, err
			}
			if t != nil {
				names = append(names, t.names()...)
			}
		}
		hint = suggest(unknown, names)
		if i := strings.Index(q, m[1]); i >= 0 {
			if _, ok := c.r.At[field]; ok {
				line, col = s.inScalar(c.r, line, col, q, utf8.RuneCountInString(q[:i]))
			}
		}
	}
	c.addAt(line, col, Error, "%s does not prepare on the server: %s%s (MySQL error %d)", name, me.Message, hint, me.Number)
	return n, false, nil
}

// sampleArg returns a value of the kind the daemon binds for column cl
// (rules.Value.SQLArg): integers as int64, everything else as text.
func sampleArg(cl *column) any {
	if cl == nil {
		return "1"
	}
	switch classify(cl) {
	case classInt, classBit:
		return int64(1)
	case classDecimal, classFloat:
		return "1"
	case classTemporal:
		return "2000-01-01 00:00:00"
	case classJSON:
		return "{}"
	}
	return "a"
}

// explain runs EXPLAIN on the rule's query, its placeholders bound to
// sample values of the args' types, in a read-only transaction, and
// reports every table it reads whole without an index it could use.
func (s *Schema) explain(ctx context.Context, c *ruleCheck, t *table, field, name string) error {
	r := c.r
	args := make([]any, len(r.Args))
	for i, a := range r.Args {
		var cl *column
		if t != nil {
			cl = t.column(a)
		}
		args[i] = sampleArg(cl)
	}
	tx, err := s.conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("explain %s: %w", name, err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, "EXPLAIN "+r.Query, args...)
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			c.add(field, Error, "EXPLAIN %s fails: %s (MySQL error %d)", name, me.Message, me.Number)
			return nil
		}
		return fmt.Errorf("explain %s: %w", name, err)
	}
	plan, err := readRows(rows)
	if err != nil {
		return fmt.Errorf("explain %s: %w", name, err)
	}
	sc := scanQuery(r.Query)
	for _, row := range plan {
		access, ref := row["type"], row["table"]
		if (access != "ALL" && access != "index") || ref == "" || strings.HasPrefix(ref, "<") {
			continue
		}
		if access == "ALL" && row["possible_keys"] != "" {
			continue // an index exists; the optimizer prefers a scan at the table's present size
		}
		tr, ok := sc.table(ref)
		if !ok {
			tr = tableRef{name: ref}
		}
		scannedTable, err := s.table(ctx, cmp.Or(tr.schema, s.current), tr.name)
		if err != nil {
			return err
		}
		has := func(string) bool { return false }
		if scannedTable != nil {
			has = func(col string) bool { return foldColumn(scannedTable, col) != "" }
		}
		how := "reads the whole table"
		if access == "index" {
			how = fmt.Sprintf("reads the whole index %s of", row["key"])
		}
		rowsNote := ""
		if n := row["rows"]; n != "" {
			rowsNote = ", rows " + n
		}
		idx := sc.indexColumns(ref, has)
		if len(idx) == 0 {
			c.add(field, Warning, "%s %s %s on every miss (EXPLAIN: type %s%s), and compares none of its columns with a '?' or a constant: no index can serve it",
				name, how, tr.name, access, rowsNote)
			continue
		}
		cols := strings.Join(idx, ", ")
		c.add(field, Warning, "%s %s %s on every miss (EXPLAIN: type %s%s): an index on %s (%s) would serve it: ALTER TABLE %s ADD INDEX (%s)",
			name, how, tr.name, access, rowsNote, tr.name, cols, tr.name, cols)
	}
	return nil
}

// readRows reads every row as text by lower-case column name; NULL is "".
func readRows(rows *sql.Rows) ([]map[string]string, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		m := make(map[string]string, len(cols))
		for i, c := range cols {
			m[strings.ToLower(c)] = vals[i].String
		}
		out = append(out, m)
	}
	return out, rows.Err()
}
