package decode

import (
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// debezium decodes a Debezium change event (m is the payload when the
// message had a schema envelope).
//
// Operations are Debezium's op letters (debeziumOps): "c" insert, "u"
// update, "d" delete, "r" read, "t" truncate; "c" with source.snapshot true, "true", "last" or another snapshot marker
// (older connectors' snapshot rows) is a read; "m" (a logical decoding
// message, which names no row) is skipped as SkipMessage. Any other op is
// a DecodeError naming the table: a row change the decoder cannot read
// must not pass unnoticed. The table is source.db (or source.schema, for
// connectors that have one) and source.table.
func (d *Decoder) debezium(m msg, pos rules.Position, out *Decoded) error {
	const f = FormatDebezium
	st := &out.st
	opText, opField := m.str(kOp)
	if opField == nil {
		if skip := m.debeziumSkip(); skip != "" {
			out.Skip = skip
			return nil
		}
		return &DecodeError{Format: f, Offset: -1, Path: strings.TrimSuffix(m.prefix, "."), Reason: `not a Debezium change event: no "op" member`}
	}
	if opField.val.Kind != rules.KindString {
		return &DecodeError{Format: f, Offset: int(opField.off), Path: m.prefix + "op", Reason: "op is not a string"}
	}

	src, db, table, snapshot, err := st.debeziumSource(m, pos)
	if err != nil {
		return err
	}
	known, ok := parseDebeziumOp(opText)
	switch {
	case !ok:
		return d.unknownOp(f, opField, m.prefix+"op", opText, debeziumOpLetters(), pos.Topic, db, table)
	case known.message:
		out.Skip = SkipMessage
		return nil
	}
	op := known.op
	if op == rules.Insert && snapshot {
		op = rules.Read
	}

	before, ok := rowOf(m.get(kBefore))
	if !ok {
		return &DecodeError{Format: f, Offset: int(m.get(kBefore).off), Path: m.prefix + "before", Reason: "before is not an object or null"}
	}
	after, ok := rowOf(m.get(kAfter))
	if !ok {
		return &DecodeError{Format: f, Offset: int(m.get(kAfter).off), Path: m.prefix + "after", Reason: "after is not an object or null"}
	}
	switch op {
	case rules.Insert, rules.Read, rules.Update:
		if !after.present() {
			return &DecodeError{Format: f, Offset: -1, Path: m.prefix + "after", Reason: "op " + opText + " without an after image"}
		}
	case rules.Delete:
		if !before.present() {
			return &DecodeError{Format: f, Offset: -1, Path: m.prefix + "before", Reason: "op d without a before image"}
		}
	case rules.Truncate:
		before, after = absent, absent
	}

	db, table, missing := d.resolveTable(pos.Topic, db, table)
	if missing != "" {
		return d.missingTable(f, missing, m.prefix+"source."+shortName(missing), pos.Topic)
	}
	if err := st.applySchemaDecimals(f, m, before, after); err != nil {
		return err
	}
	out.addEvent(op, db, table, before, after, src)
	return nil
}

// debeziumSource reads a change event's source block: the table it names
// (db, or schema for connectors that have one, and table), the binlog
// position, GTID, server id and source time it adds to pos, and whether
// the row comes from a snapshot.
func (st *decodeState) debeziumSource(m msg, pos rules.Position) (src rules.Position, db, table string, snapshot bool, err error) {
	src = pos
	sourceTs, sourceTsSec := int64(-1), int64(-1)
	if sf := m.get(kSource); sf != nil && !(sf.shape == shapeScalar && sf.val.Kind == rules.KindNull) {
		if sf.shape != shapeSource {
			return src, "", "", false, &DecodeError{Format: FormatDebezium, Offset: int(sf.off), Path: m.prefix + "source", Reason: "source is not an object"}
		}
		si := &st.sources[sf.lo]
		db, table = si.db, si.table
		if si.schema != "" {
			// Connectors with schemas (PostgreSQL, SQL Server) name tables
			// schema.table.
			db = si.schema
		}
		if si.file != "" {
			src.BinlogFile = si.file
		}
		if si.pos >= 0 {
			src.BinlogPos = si.pos
		}
		if si.gtid != "" {
			src.GTID = si.gtid
		}
		if si.serverID != 0 {
			src.ServerID = si.serverID
		}
		sourceTs, sourceTsSec, snapshot = si.tsMs, si.tsSec, si.snapshot
	}
	// Source time: when the change happened in the database. Snapshot rows
	// of old connectors carry 0 there; fall back to the legacy ts_sec, then
	// to the time the connector processed the row.
	switch {
	case sourceTs > 0:
		src.TsMs = sourceTs
	case sourceTsSec > 0:
		src.TsMs = sourceTsSec * 1000
	default:
		if tf := m.get(kTsMs); tf != nil {
			if n, ok := parseInt64(tf.val); ok {
				src.TsMs = n
			}
		}
	}
	return src, db, table, snapshot, nil
}

// isSnapshotMarker reports whether source.snapshot says the row comes from
// a snapshot: true, or any string but "false" (connectors write "true",
// "last", "first", "incremental", ...).
func isSnapshotMarker(v rules.Value) bool {
	switch v.Kind {
	case rules.KindBool:
		return v.Text == "1"
	case rules.KindString:
		return v.Text != "" && v.Text != "false"
	}
	return false
}

// flat decodes a row flattened by ExtractNewRecordState: every member not
// starting with "__" is a column.
//
// __op is one of Debezium's op letters (debeziumOps: "c" an insert, "r" a
// read, "u" an update, "d" a delete, "t" a truncate, "m" a logical
// decoding message, skipped as SkipMessage); no __op is an update (an
// upsert without before image); any other __op is a DecodeError naming
// the table (unless __deleted makes the row a delete). __deleted "true" (or true) makes it a delete whose before image
// is the row. The table comes from __db/__table, else from the decoder's
// topic map or default table. __source_ts_ms (else __ts_ms),
// __source_file, __source_pos, __source_gtid and __source_server_id fill
// the source position.
func (d *Decoder) flat(m msg, pos rules.Position, out *Decoded) error {
	const f = FormatDebeziumFlat
	st := &out.st
	src := pos
	op := rules.Update
	meta := flatMeta{tsMs: -1, legacyTs: -1}
	lo := int32(len(st.cols))
	for i := range m.fields {
		fd := &m.fields[i]
		if !strings.HasPrefix(fd.name, "__") {
			st.addColumn(fd.name, fd.val)
			continue
		}
		if err := meta.read(m, fd, &src); err != nil {
			return err
		}
	}
	row := span{lo, int32(len(st.cols))}
	switch {
	case meta.tsMs >= 0:
		src.TsMs = meta.tsMs
	case meta.legacyTs >= 0:
		src.TsMs = meta.legacyTs
	}
	db, table, deleted := meta.db, meta.table, meta.deleted
	if opText := meta.opText; opText != "" {
		known, ok := parseDebeziumOp(opText)
		switch {
		case !ok && !deleted:
			return d.unknownOp(f, m.get(kFlatOp), m.prefix+"__op", opText, debeziumOpLetters(), pos.Topic, db, table)
		case known.message && !deleted:
			out.Skip = SkipMessage
			return nil
		case ok:
			op = known.op
		}
	}
	if deleted {
		op = rules.Delete
	}
	db, table, missing := d.resolveTable(pos.Topic, db, table)
	if missing != "" {
		return d.missingTable(f, missing, m.prefix+"__"+shortName(missing), pos.Topic)
	}
	before, after := absent, row
	switch op {
	case rules.Delete:
		before, after = row, absent
	case rules.Truncate:
		before, after = absent, absent
	}
	if err := st.applySchemaDecimals(f, m, row, absent); err != nil {
		return err
	}
	out.addEvent(op, db, table, before, after, src)
	return nil
}

// flatMeta is what the "__" fields of a flattened row say.
type flatMeta struct {
	opText, db, table string
	deleted           bool
	// tsMs and legacyTs are __source_ts_ms and __ts_ms, -1 when absent.
	tsMs, legacyTs int64
}

// read takes in the "__" field fd of a flattened row m: the op, deletion
// mark and table into fm, the source position into src. Other "__"
// fields are ignored.
func (fm *flatMeta) read(m msg, fd *field, src *rules.Position) error {
	v := fd.val
	switch fd.name {
	case "__op":
		if v.Kind == rules.KindNull {
			return nil // as if absent (Avro writes an optional __op as null)
		}
		if v.Kind != rules.KindString {
			return &DecodeError{Format: FormatDebeziumFlat, Offset: int(fd.off), Path: m.prefix + "__op", Reason: "__op is not a string"}
		}
		fm.opText = v.Text
	case "__deleted":
		switch {
		case v.Kind == rules.KindNull:
		case (v.Kind == rules.KindString && v.Text == "true") || (v.Kind == rules.KindBool && v.Text == "1"):
			fm.deleted = true
		case (v.Kind == rules.KindString && v.Text == "false") || (v.Kind == rules.KindBool && v.Text == "0"):
		default:
			return &DecodeError{Format: FormatDebeziumFlat, Offset: int(fd.off), Path: m.prefix + "__deleted", Reason: `__deleted is not "true" or "false"`}
		}
	case "__db":
		setText(&fm.db, v)
	case "__table":
		setText(&fm.table, v)
	case "__source_ts_ms":
		setInt64(&fm.tsMs, v)
	case "__ts_ms":
		setInt64(&fm.legacyTs, v)
	case "__source_file":
		setText(&src.BinlogFile, v)
	case "__source_pos":
		setInt64(&src.BinlogPos, v)
	case "__source_gtid":
		setText(&src.GTID, v)
	case "__source_server_id":
		if id := parseServerID(v); id != 0 {
			src.ServerID = id
		}
	}
	return nil
}

// setText sets *dst to v's text when v is a string, else leaves it.
func setText(dst *string, v rules.Value) {
	if v.Kind == rules.KindString {
		*dst = v.Text
	}
}

// setInt64 sets *dst to v's number when v is an integer or a string
// holding one (parseInt64), else leaves it.
func setInt64(dst *int64, v rules.Value) {
	if n, ok := parseInt64(v); ok {
		*dst = n
	}
}

// shortName is how Debezium names a missing "database" or "table" field
// ("db" or "table").
func shortName(what string) string {
	if what == "database" {
		return "db"
	}
	return what
}
