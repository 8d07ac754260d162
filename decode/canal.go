package decode

import (
	"slices"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// canalKind is how a Canal column's string values are typed.
type canalKind uint8

const (
	canalString canalKind = iota
	canalInt
	canalFloat
)

// canal decodes a Canal flat message: "data" holds one or more rows, each
// becoming one event.
//
// Types INSERT, UPDATE and DELETE are row changes; INIT (Flink's snapshot
// rows) is a read. The before image of an UPDATE row is data[i] overlaid
// with old[i] (previous values of changed columns). A DDL message
// (isDdl true) is skipped as SkipDDL, except TRUNCATE, which becomes a
// truncate event for the message's database and table. Types that carry
// no row whatever isDdl says are skipped: CREATE, ALTER, ERASE, RENAME,
// CINDEX and DINDEX as SkipDDL, QUERY, GTID, XACOMMIT and XAROLLBACK as
// SkipQuery, MHEARTBEAT as SkipHeartbeat. Any other type is a DecodeError
// naming the table: a row change the decoder cannot read must not pass
// unnoticed.
//
// Canal writes every value as a string; strings are typed by the
// column's "mysqlType" (or, when the message has no mysqlType, its
// java.sql.Types "sqlType"): integer, BIT and BOOL types become KindInt,
// DECIMAL, NUMERIC, FLOAT, DOUBLE and REAL become KindFloat when the text
// is a number; everything else, and a column absent from the type map,
// stays a string. Values already written as JSON numbers keep their JSON
// kind.
func (d *Decoder) canal(m msg, pos rules.Position, out *Decoded) error {
	const f = FormatCanal
	st := &out.st
	typ, tf := m.str(kType)
	if tf == nil || tf.val.Kind != rules.KindString {
		return &DecodeError{Format: f, Offset: -1, Path: "type", Reason: "missing or non-string type"}
	}
	isDdl := false
	if df := m.get(kIsDdl); df != nil {
		isDdl = df.val.Kind == rules.KindBool && df.val.Text == "1"
	}

	src := pos
	if n, ok := m.int64(kEs); ok && n > 0 {
		src.TsMs = n
	} else if n, ok := m.int64(kTs); ok {
		src.TsMs = n
	}
	if g, _ := m.str(kGTID); g != "" {
		src.GTID = g
	}
	db, _ := m.str(kDatabase)
	table, _ := m.str(kTable)

	var op rules.Operation
	switch {
	case isDdl && typ == "TRUNCATE":
		// The database member of a DDL message is the session's default
		// schema, which may differ from the one the statement named; a
		// truncate is still better delivered than dropped.
		db, table, missing := d.resolveTable(pos.Topic, db, table)
		if missing != "" {
			return d.missingTable(f, missing, missing, pos.Topic)
		}
		out.addEvent(rules.Truncate, db, table, absent, absent, src)
		return nil
	case isDdl:
		out.Skip = SkipDDL
		return nil
	case typ == "INSERT":
		op = rules.Insert
	case typ == "UPDATE":
		op = rules.Update
	case typ == "DELETE":
		op = rules.Delete
	case typ == "INIT":
		op = rules.Read
	default:
		if skip := canalSkip(typ); skip != "" {
			out.Skip = skip
			return nil
		}
		return d.unknownOp(f, tf, "type", typ, "INSERT, UPDATE, DELETE, INIT, TRUNCATE, DDL and marker types", pos.Topic, db, table)
	}

	data, old, err := d.canalRows(st, m, pos, typ, db, table)
	if err != nil || len(data) == 0 {
		if err == nil {
			out.Skip = SkipEmpty
		}
		return err
	}
	db, table, missing := d.resolveTable(pos.Topic, db, table)
	if missing != "" {
		return d.missingTable(f, missing, missing, pos.Topic)
	}

	if types := st.canalTypes(m); types.present() {
		for _, r := range data {
			st.typeRow(r, types)
		}
		for _, r := range old {
			st.typeRow(r, types)
		}
	}

	out.addCanalEvents(op, db, table, data, old, src)
	return nil
}

// canalRows returns the rows of a Canal message of type typ: data, and the
// old values of updated columns (old, nil when absent); no data rows is
// not an error. db and table name the table in errors.
func (d *Decoder) canalRows(st *decodeState, m msg, pos rules.Position, typ, db, table string) (data, old []span, err error) {
	const f = FormatCanal
	df := m.get(kData)
	if of := m.get(kOld); (df != nil && df.shape == shapeManyRows) || (of != nil && of.shape == shapeManyRows) {
		e := &DecodeError{Format: f, Offset: -1, Path: "data", Reason: "more than " + strconv.Itoa(MaxMessageRows) + " rows in one message (the most cachewarden reads, to bound the memory a message takes)"}
		if db, table, missing := d.resolveTable(pos.Topic, db, table); missing == "" {
			e.Database, e.Table = strings.Clone(db), strings.Clone(table)
		}
		return nil, nil, e
	}
	switch {
	case df == nil || (df.shape == shapeScalar && df.val.Kind == rules.KindNull):
		return nil, nil, &DecodeError{Format: f, Offset: -1, Path: "data", Reason: typ + " without data"}
	case df.shape != shapeRows:
		return nil, nil, &DecodeError{Format: f, Offset: int(df.off), Path: "data", Reason: "data is not an array of objects"}
	}
	data = st.rows[df.lo:df.hi]
	if len(data) == 0 {
		return nil, nil, nil
	}
	if of := m.get(kOld); of != nil && !(of.shape == shapeScalar && of.val.Kind == rules.KindNull) {
		if of.shape != shapeRows {
			return nil, nil, &DecodeError{Format: f, Offset: int(of.off), Path: "old", Reason: "old is not an array of objects or null"}
		}
		old = st.rows[of.lo:of.hi]
	}
	return data, old, nil
}

// addCanalEvents adds one event per row of data, the before image of an
// update being old's row over data's.
func (out *Decoded) addCanalEvents(op rules.Operation, db, table string, data, old []span, src rules.Position) {
	st := &out.st
	// Room for every event and the before images of updates at once: a
	// message may hold many thousand rows.
	out.Events = slices.Grow(out.Events, len(data))
	st.evRows = slices.Grow(st.evRows, len(data))
	if op == rules.Update {
		n := 0
		for _, r := range data {
			n += int(r.hi - r.lo)
		}
		for _, r := range old {
			n += int(r.hi - r.lo)
		}
		st.cols = slices.Grow(st.cols, n)
	}
	for i, r := range data {
		before, after := absent, r
		switch op {
		case rules.Update:
			o := absent
			if i < len(old) {
				o = old[i]
			}
			before = st.overlay(r, o)
		case rules.Delete:
			before, after = r, absent
		}
		out.addEvent(op, db, table, before, after, src)
	}
}

// canalSkip classifies the Canal event types that carry no row (Canal's
// EventType); "" for any other.
func canalSkip(typ string) string {
	switch typ {
	case "CREATE", "ALTER", "ERASE", "RENAME", "CINDEX", "DINDEX":
		return SkipDDL
	case "QUERY", "GTID", "XACOMMIT", "XAROLLBACK":
		return SkipQuery
	case "MHEARTBEAT":
		return SkipHeartbeat
	}
	return ""
}

// int64 returns the integer value of key k.
func (m msg) int64(k int) (int64, bool) {
	f := m.get(k)
	if f == nil {
		return 0, false
	}
	return parseInt64(f.val)
}

// canalTypes fills st.kinds with the kind of every column of the message's
// mysqlType (else sqlType) map and returns the map's row; st.kinds[k] is
// the kind of the map's k-th column.
func (st *decodeState) canalTypes(m msg) span {
	st.kinds = st.kinds[:0]
	if tf := m.get(kMysqlType); tf != nil && tf.shape == shapeRow {
		for _, c := range st.cols[tf.lo:tf.hi] {
			k := canalString
			if c.Value.Kind == rules.KindString {
				k = mysqlTypeKind(c.Value.Text)
			}
			st.kinds = append(st.kinds, k)
		}
		return span{tf.lo, tf.hi}
	}
	if tf := m.get(kSQLType); tf != nil && tf.shape == shapeRow {
		for _, c := range st.cols[tf.lo:tf.hi] {
			k := canalString
			if n, ok := parseInt64(c.Value); ok {
				k = sqlTypeKind(n)
			}
			st.kinds = append(st.kinds, k)
		}
		return span{tf.lo, tf.hi}
	}
	return absent
}

// mysqlTypeKind classifies a column type as Canal writes it: "int(11)",
// "bigint(20) unsigned", "decimal(10,2)", or Flink's "INTEGER", "FLOAT".
func mysqlTypeKind(t string) canalKind {
	// Lower-case the base name (up to "(" or " ") into a small buffer.
	var buf [10]byte
	n := 0
	for i := 0; i < len(t) && t[i] != '(' && t[i] != ' '; i++ {
		if n == len(buf) {
			return canalString
		}
		c := t[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[n] = c
		n++
	}
	switch string(buf[:n]) {
	case "int", "integer", "bigint", "tinyint", "smallint", "mediumint", "year", "bit", "bool", "boolean", "serial":
		return canalInt
	case "decimal", "numeric", "float", "double", "real", "dec", "fixed":
		return canalFloat
	}
	return canalString
}

// sqlTypeKind classifies a java.sql.Types code.
func sqlTypeKind(code int64) canalKind {
	switch code {
	case -7, -6, 5, 4, -5, 16: // BIT, TINYINT, SMALLINT, INTEGER, BIGINT, BOOLEAN
		return canalInt
	case 6, 7, 8, 2, 3: // FLOAT, REAL, DOUBLE, NUMERIC, DECIMAL
		return canalFloat
	}
	return canalString
}

// typeRow types the string values of row r by the type map types, whose
// kinds are in st.kinds. Columns usually come in the map's order, so the
// same position is tried first.
func (st *decodeState) typeRow(r, types span) {
	nt := int(types.hi - types.lo)
	for i := r.lo; i < r.hi; i++ {
		c := &st.cols[i]
		if c.Value.Kind != rules.KindString {
			continue
		}
		k, pos := canalString, int(i-r.lo)
		if pos < nt && st.cols[int(types.lo)+pos].Name == c.Name {
			k = st.kinds[pos]
		} else {
			for j := 0; j < nt; j++ {
				if st.cols[int(types.lo)+j].Name == c.Name {
					k = st.kinds[j]
					break
				}
			}
		}
		switch k {
		case canalInt:
			if isIntText(c.Value.Text) {
				c.Value.Kind = rules.KindInt
			}
		case canalFloat:
			if _, ok := numberKind(c.Value.Text); ok {
				c.Value.Kind = rules.KindFloat
			}
		}
	}
}

// isIntText reports whether s is an optional '-' followed by decimal
// digits.
func isIntText(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// numberKind reports whether s is exactly one JSON number literal and
// whether it is an integer (KindInt) or not (KindFloat).
func numberKind(s string) (rules.Kind, bool) {
	var sc scanner
	sc.s = s
	v, ok := sc.number()
	if !ok || sc.i != len(s) {
		return rules.KindNull, false
	}
	return v.Kind, true
}
