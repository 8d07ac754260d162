package check

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
)

// Schema checks loaded rules against the live schema of a MySQL or
// MariaDB server (information_schema):
//
//   - the table of every rule exists, and every column the rule names
//     does: key and member placeholders, `columns`, `args` and the
//     identifiers of `when` (errors, with the closest name when one is
//     near);
//   - key and member placeholders have types that render the same text
//     whatever produced the change event, and `when` columns types it
//     can compare (JSON columns, MariaDB's LONGTEXT with CHECK
//     (json_valid) included, and spatial columns in keys are errors; decimals,
//     floats, dates and times, binary and BIT columns are warnings);
//   - load, recount and keys queries prepare on the server, which takes
//     as many parameters as args names columns (errors);
//   - they return what the daemon and verify read (meaning.go): a load
//     one column, the member's; a recount one COUNT; a keys query the
//     key's distinct placeholder columns, in order (errors);
//   - per EXPLAIN, load and recount queries do not read a whole table
//     that has no index they could use (a warning naming the query and
//     the index that would serve it);
//   - key templates that can render more than 250 bytes, given the
//     columns' maximum lengths and escaping (a byte <= 0x20, 0x7f or '%'
//     becomes three), are warnings that name the hashing that applies.
//
// A rule's `db.table` is looked up in the schema Databases maps db to,
// else in the database of that name, else, when the server has none, in
// the connection's current database (the DSN's), where load and recount
// queries run as in the daemon.
//
// A Schema is used by one goroutine at a time.
type Schema struct {
	DB *sql.DB
	// Databases maps database names of rules to schemas on the server.
	Databases map[string]string
	// Log receives progress at debug level; nil discards.
	Log *slog.Logger

	conn    *sql.Conn
	current string
	schemas map[string]bool
	tables  map[[2]string]*table
	lines   map[string][]string
	used    []string
	// folded caches what each collation folds (folds).
	folded map[string]folding
}

// table is a table's columns, in order.
type table struct {
	schema, name string
	columns      []*column
}

func (t *table) column(name string) *column {
	for _, c := range t.columns {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (t *table) names() []string {
	out := make([]string, len(t.columns))
	for i, c := range t.columns {
		out[i] = c.Name
	}
	return out
}

// Check checks every rule of rs. It returns the findings and the schemas
// looked at; the error is a failure to talk to the server, after which
// the findings are incomplete.
func (s *Schema) Check(ctx context.Context, rs *rules.RuleSet) ([]Finding, []string, error) {
	if err := s.open(ctx); err != nil {
		return nil, nil, err
	}
	defer s.conn.Close()
	var out []Finding
	for _, r := range rs.Rules() {
		fs, err := s.rule(ctx, r)
		out = append(out, fs...)
		if err != nil {
			return out, s.used, fmt.Errorf("rule %q: %w", r.Name, err)
		}
	}
	return out, s.used, nil
}

// open takes a connection from DB and reads its current database.
func (s *Schema) open(ctx context.Context) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	s.conn = conn
	s.schemas = map[string]bool{}
	s.tables = map[[2]string]*table{}
	s.lines = map[string][]string{}
	s.folded = map[string]folding{}
	var cur sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&cur); err != nil {
		conn.Close()
		return fmt.Errorf("connect: %w", err)
	}
	s.current = cur.String
	return nil
}

// ruleCheck collects the findings of one rule.
type ruleCheck struct {
	s   *Schema
	r   *rules.Rule
	out []Finding
}

// at returns the position of the first of fields the rule has, else the
// rule's.
func (c *ruleCheck) at(fields ...string) (line, col int) {
	for _, f := range fields {
		if l, ok := c.r.At[f]; ok {
			return l.Line, l.Column
		}
	}
	return c.r.Line, c.r.Column
}

func (c *ruleCheck) addAt(line, col int, sev Severity, format string, args ...any) {
	c.out = append(c.out, Finding{File: c.r.File, Line: line, Column: col, Severity: sev, Rule: c.r.Name,
		Message: fmt.Sprintf("rule %q: ", c.r.Name) + fmt.Sprintf(format, args...)})
}

func (c *ruleCheck) add(field string, sev Severity, format string, args ...any) {
	line, col := c.at(field)
	c.addAt(line, col, sev, format, args...)
}

// kindField returns the rule's field holding sub ("key", "recount"...):
// "bump" for a bump rule's key, else "set.sub" or "count.sub".
func kindField(r *rules.Rule, sub string) string {
	if r.Kind == rules.BumpRule {
		return "bump"
	}
	return r.Kind.String() + "." + sub
}

func queryField(r *rules.Rule) (field, name string) {
	if r.Kind == rules.SetRule {
		return "set.load", "load"
	}
	return "count.recount", "recount"
}

func (s *Schema) rule(ctx context.Context, r *rules.Rule) ([]Finding, error) {
	c := &ruleCheck{s: s, r: r}
	t, err := s.ruleTable(ctx, c)
	if err != nil {
		return c.out, err
	}
	if t != nil {
		s.columns(c, t)
		s.keyLength(c, t)
		s.masterKey(c, t)
		if err := s.collations(ctx, c, t); err != nil {
			return c.out, err
		}
	}
	if r.Query != "" {
		if err := s.query(ctx, c, t); err != nil {
			return c.out, err
		}
	}
	if r.Keys != "" {
		if err := s.keysQuery(ctx, c, t); err != nil {
			return c.out, err
		}
	}
	return c.out, nil
}

// ruleTable finds the rule's table; nil (with a finding) when it does not
// exist.
func (s *Schema) ruleTable(ctx context.Context, c *ruleCheck) (*table, error) {
	r := c.r
	schema, how := "", ""
	switch mapped, ok := s.Databases[r.Database]; {
	case ok && r.Database != "":
		schema, how = mapped, fmt.Sprintf(" (database %s maps to %s)", r.Database, mapped)
	case r.Database != "":
		exists, err := s.schemaExists(ctx, r.Database)
		if err != nil {
			return nil, err
		}
		if exists {
			schema = r.Database
		} else {
			schema, how = s.current, fmt.Sprintf(" (the server has no database %s; looked in the DSN's database)", r.Database)
		}
	default:
		schema = s.current
	}
	name := r.Table
	if r.Database != "" {
		name = r.Database + "." + r.Table
	}
	if schema == "" {
		c.add("table", Error, "table %s: the server has no database %s and the DSN names none; name one in the DSN or map it with --database %s=SCHEMA",
			name, r.Database, r.Database)
		return nil, nil
	}
	t, err := s.table(ctx, schema, r.Table)
	if err != nil || t != nil {
		return t, err
	}
	others, err := s.tableNames(ctx, schema)
	if err != nil {
		return nil, err
	}
	c.add("table", Error, "table %s not found: database %s has no table %q that the DSN's user can see%s%s", name, schema, r.Table, how, suggest(r.Table, others))
	return nil, nil
}

// colRef is one column a rule names.
type colRef struct {
	name  string
	field string // the rule field naming it
	what  string // how the message names it
	role  colRole
	// offset is the rune offset of a `when` identifier, else -1.
	offset int
}

type colRole uint8

const (
	roleKey colRole = iota + 1
	roleMember
	roleWhen
	roleArg
	roleOther
)

// refs lists the columns r names, each once per field.
func refs(r *rules.Rule) []colRef {
	var out []colRef
	seen := map[string]bool{}
	add := func(ref colRef) {
		k := ref.field + "\x00" + ref.name
		if !seen[k] {
			seen[k] = true
			out = append(out, ref)
		}
	}
	if r.Key != nil {
		f := kindField(r, "key")
		for _, n := range r.Key.Columns() {
			add(colRef{name: n, field: f, what: "key placeholder {" + n + "}", role: roleKey, offset: -1})
		}
	}
	if r.Member != nil {
		for _, n := range r.Member.Columns() {
			add(colRef{name: n, field: "set.member", what: "member placeholder {" + n + "}", role: roleMember, offset: -1})
		}
	}
	for _, n := range r.Columns {
		add(colRef{name: n, field: "columns", what: fmt.Sprintf("columns entry %q", n), role: roleOther, offset: -1})
	}
	if f := kindField(r, "args"); r.At[f] != (rules.Location{}) || r.At == nil {
		for _, n := range r.Args {
			add(colRef{name: n, field: f, what: fmt.Sprintf("args entry %q", n), role: roleArg, offset: -1})
		}
	} // else args are the key's placeholders, checked above
	if r.When != "" {
		cols, err := whenColumns(r.When)
		if err == nil {
			slices.SortStableFunc(cols, func(a, b whenColumn) int { return a.offset - b.offset })
			for _, wc := range cols {
				add(colRef{name: wc.name, field: "when", what: "when identifier " + wc.name, role: roleWhen, offset: wc.offset})
			}
		}
	}
	return out
}

// columns checks that every column r names exists in t with a usable
// type.
func (s *Schema) columns(c *ruleCheck, t *table) {
	tname := c.r.Table
	if c.r.Database != "" {
		tname = c.r.Database + "." + c.r.Table
	}
	typed := map[string]bool{}
	for _, ref := range refs(c.r) {
		line, col := c.at(ref.field)
		if ref.role == roleWhen {
			if _, ok := c.r.At["when"]; ok {
				line, col = s.inScalar(c.r, line, col, c.r.When, ref.offset)
			}
		}
		cl := t.column(ref.name)
		if cl == nil {
			msg := fmt.Sprintf("%s: table %s has no column %q", ref.what, tname, ref.name)
			if other := foldColumn(t, ref.name); other != "" {
				msg += fmt.Sprintf("; its column is %q, and change events name it so (rules name columns exactly)", other)
			} else {
				msg += suggest(ref.name, t.names())
			}
			c.addAt(line, col, Error, "%s", msg)
			continue
		}
		var sev Severity
		var why string
		switch ref.role {
		case roleKey, roleMember:
			sev, why = renderProblem(cl)
		case roleWhen:
			sev, why = whenProblem(cl)
		}
		if sev == "" || typed[fmt.Sprint(ref.role)+ref.name] {
			continue
		}
		typed[fmt.Sprint(ref.role)+ref.name] = true
		c.addAt(line, col, sev, "%s: column %s.%s %s", ref.what, tname, cl.Name, why)
	}
}

func foldColumn(t *table, name string) string {
	for _, c := range t.columns {
		if strings.EqualFold(c.Name, name) {
			return c.Name
		}
	}
	return ""
}

// inScalar locates the rune at offset in text, the value of a rule's
// field that starts at line:col: exact when the value is written on one
// line as it reads (plain, or quoted without escapes); else the value's
// position.
func (s *Schema) inScalar(r *rules.Rule, line, col int, text string, offset int) (int, int) {
	if offset < 0 || strings.Contains(text, "\n") {
		return line, col
	}
	lines, ok := s.lines[r.File]
	if !ok {
		if data, err := yamlfile.ReadFile(r.File); err == nil {
			lines = strings.Split(string(data), "\n")
		}
		s.lines[r.File] = lines
	}
	if line < 1 || line > len(lines) {
		return line, col
	}
	raw := []rune(lines[line-1])
	want := []rune(text)
	for _, start := range []int{col - 1, col} { // plain, or after the opening quote
		if start >= 0 && start+len(want) <= len(raw) && string(raw[start:start+len(want)]) == text {
			return line, start + offset + 1
		}
	}
	return line, col
}

// keyLength reports key templates that can render beyond MaxKeyLen.
func (s *Schema) keyLength(c *ruleCheck, t *table) {
	r := c.r
	if r.Key == nil {
		return
	}
	src := r.Key.String()
	literal := len(src)
	total := int64(len(r.Prefix))
	var parts []string
	for _, n := range r.Key.Columns() {
		literal -= len(n) + 2
		cl := t.column(n)
		if cl == nil {
			return // reported as missing
		}
		m, ok := maxRendered(cl)
		if !ok {
			return
		}
		total += m
		parts = append(parts, fmt.Sprintf("{%s} %s up to %d", n, cl.ColumnType, m))
	}
	total += int64(literal)
	suffix := ""
	if r.Copies > 0 {
		total += int64(rules.CopySuffixLen(r.Copies - 1))
		suffix = fmt.Sprintf(" + copy suffix %%copy%d", r.Copies-1)
	}
	if total <= rules.MaxKeyLen {
		return
	}
	c.add(kindField(r, "key"), Warning,
		"key %q can render %d bytes (prefix %d + literal text %d + %s%s, a byte <= 0x20, 0x7f or %% escaped to three), beyond memcached's %d: "+
			"such keys become their first 200 bytes, '%%#' and the first 32 hex digits of the SHA-256 of the whole key (234 bytes); "+
			"applications build them with the same key function (rules.Key, client's Client.Key)",
		src, total, len(r.Prefix), literal, strings.Join(parts, " + "), suffix, rules.MaxKeyLen)
}

// masterKey reports an evidence rule whose key template renders its
// master's key for some value of the entity column (a text column, where
// "ns:member:{id}" can render the master "ns:member:master"): that entity's
// namespace and the master would be one item, which neither reads as what
// it wrote, so each recreates it and every entity's versions start over.
// An integer column renders only digits.
func (s *Schema) masterKey(c *ruleCheck, t *table) {
	r := c.r
	ev := r.Evidence
	if ev == nil || ev.Master == nil || r.Key == nil {
		return
	}
	cl := t.column(ev.Column)
	if cl == nil {
		return // reported as missing
	}
	var id string
	accept := func(_, text string) bool {
		if classify(cl) == classInt && strings.Trim(strings.TrimPrefix(text, "-"), "0123456789") != "" {
			return false
		}
		id = text
		return true
	}
	if !r.Key.CanRender(r.Prefix, r.Prefix+ev.Master.String(), accept) {
		return
	}
	c.add("evidence", Warning,
		"key %q renders the evidence master's key %q for the %s %s %q: that entity's namespace and the master would be one item; "+
			"choose a master key the key template cannot render (for example one that differs in the literal text before {%s})",
		r.Key.String(), ev.Master.String(), cl.ColumnType, ev.Column, id, ev.Column)
}

func (s *Schema) schemaExists(ctx context.Context, name string) (bool, error) {
	if ok, seen := s.schemas[name]; seen {
		return ok, nil
	}
	var n int
	err := s.conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("information_schema.SCHEMATA: %w", err)
	}
	s.schemas[name] = n > 0
	return n > 0, nil
}

// table reads a table's columns; nil when the table does not exist (or
// the user cannot see it). Names compare exactly, as rules match them.
func (s *Schema) table(ctx context.Context, schema, name string) (*table, error) {
	k := [2]string{schema, name}
	if t, ok := s.tables[k]; ok {
		return t, nil
	}
	rows, err := s.conn.QueryContext(ctx,
		"SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_MAXIMUM_LENGTH, CHARACTER_OCTET_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME, COLLATION_NAME "+
			"FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", schema, name)
	if err != nil {
		return nil, fmt.Errorf("information_schema.COLUMNS: %w", err)
	}
	defer rows.Close()
	t := &table{schema: schema, name: name}
	for rows.Next() {
		var tn string
		cl := &column{}
		if err := rows.Scan(&tn, &cl.Name, &cl.DataType, &cl.ColumnType, &cl.CharMax, &cl.OctetMax, &cl.Precision, &cl.Scale, &cl.Charset, &cl.Collation); err != nil {
			return nil, fmt.Errorf("information_schema.COLUMNS: %w", err)
		}
		if tn != name {
			continue // a case-insensitive match: not the rule's table
		}
		cl.DataType = strings.ToLower(cl.DataType)
		cl.ColumnType = strings.ToLower(cl.ColumnType)
		t.columns = append(t.columns, cl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("information_schema.COLUMNS: %w", err)
	}
	if len(t.columns) > 0 {
		if err := s.mariaDBJSON(ctx, t); err != nil {
			return nil, err
		}
	}
	if len(t.columns) == 0 {
		t = nil
	} else if !slices.Contains(s.used, schema) {
		s.used = append(s.used, schema)
	}
	s.tables[k] = t
	s.Log.Debug("table read", "schema", schema, "table", name, "found", t != nil)
	return t, nil
}

// jsonValid matches a CHECK clause, or one conjunct of it, as MariaDB
// writes the constraint of a JSON column: json_valid(`name`).
var jsonValid = regexp.MustCompile("^\\(*json_valid\\(`((?:[^`]|``)+)`\\)\\)*$")

// mariaDBJSON marks t's MariaDB JSON columns, LONGTEXT columns with a
// CHECK (json_valid(col)) (what MariaDB makes of the type JSON), with
// JSONCheck: their values are JSON text as MySQL's JSON columns are. A server
// without MariaDB's information_schema.CHECK_CONSTRAINTS (MySQL, whose
// JSON is a type of its own) has none.
func (s *Schema) mariaDBJSON(ctx context.Context, t *table) error {
	if !slices.ContainsFunc(t.columns, func(c *column) bool { return c.DataType == "longtext" }) {
		return nil
	}
	rows, err := s.conn.QueryContext(ctx,
		"SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?", t.schema, t.name)
	var me *mysql.MySQLError
	if errors.As(err, &me) && (me.Number == 1054 || me.Number == 1109) {
		return nil // no such column (MySQL 8) or table (MySQL 5.7)
	}
	if err != nil {
		return fmt.Errorf("information_schema.CHECK_CONSTRAINTS: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var clause string
		if err := rows.Scan(&clause); err != nil {
			return fmt.Errorf("information_schema.CHECK_CONSTRAINTS: %w", err)
		}
		for _, term := range strings.Split(clause, " and ") {
			m := jsonValid.FindStringSubmatch(strings.TrimSpace(term))
			if m == nil {
				continue
			}
			if c := t.column(strings.ReplaceAll(m[1], "``", "`")); c != nil && c.DataType == "longtext" {
				c.JSONCheck = true
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("information_schema.CHECK_CONSTRAINTS: %w", err)
	}
	return nil
}

// tableNames lists a schema's tables.
func (s *Schema) tableNames(ctx context.Context, schema string) ([]string, error) {
	rows, err := s.conn.QueryContext(ctx, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", schema)
	if err != nil {
		return nil, fmt.Errorf("information_schema.TABLES: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("information_schema.TABLES: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// suggest returns ` (did you mean "x"?)` for the candidate closest to
// name, when one is close enough to be a misspelling, else "".
func suggest(name string, candidates []string) string {
	best, bestD := "", -1
	for _, c := range candidates {
		d := editDistance(strings.ToLower(name), strings.ToLower(c))
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := max(1, utf8.RuneCountInString(name)/3)
	if bestD < 0 || bestD > limit {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
