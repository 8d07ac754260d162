package decode

import (
	"strconv"
	"strings"
	"unsafe"

	"github.com/cachewarden/cachewarden/rules"
)

// Reasons reported in Decoded.Skip for messages that carry no row change.
const (
	// SkipTombstone: a null or empty message value (Kafka tombstone), or a
	// Debezium envelope whose payload is null.
	SkipTombstone = "tombstone"
	// SkipDDL: a schema statement (Maxwell database-*, table-* and view-*
	// types; Canal isDdl messages other than TRUNCATE).
	SkipDDL = "ddl"
	// SkipHeartbeat: a Debezium heartbeat ({"ts_ms":...} alone).
	SkipHeartbeat = "heartbeat"
	// SkipTransaction: a Debezium transaction BEGIN/END record.
	SkipTransaction = "transaction"
	// SkipSchemaChange: a Debezium schema-change record.
	SkipSchemaChange = "schema-change"
	// SkipBootstrap: Maxwell bootstrap-start / bootstrap-complete markers.
	SkipBootstrap = "bootstrap"
	// SkipMessage: a Debezium logical decoding message (op "m"), which
	// names no row.
	SkipMessage = "message"
	// SkipQuery: the text of a statement (a Canal QUERY message, or
	// GTID/XA markers); its rows, if any, come in their own messages.
	SkipQuery = "query"
	// SkipEmpty: a row-change message that holds no rows (Canal "data":[]).
	SkipEmpty = "empty"
)

// Decoder decodes one Kafka message value into row-change events.
//
// The zero Decoder detects the format of every message. A Decoder is safe
// for concurrent use as long as its fields are not changed; each goroutine
// needs its own Decoded.
type Decoder struct {
	// Format is the format of the topic's messages; FormatAuto (the
	// default) detects it per message from the top-level keys.
	Format Format
	// TopicTables maps a topic to "db.table". It names the table of
	// flattened Debezium rows that carry no __db/__table fields, and fills
	// in a database or table missing from any message. May be nil.
	TopicTables map[string]string
	// Table is the "db.table" used when TopicTables has no entry for the
	// message's topic (the --table flag of plan). May be empty.
	Table string
	// Schemas gives the schemas of Confluent-framed Avro messages by
	// registry id; the daemon's schema registry client fills an
	// AvroSchemaCache before decoding (decoding never asks the registry).
	// nil: Avro messages cannot be decoded (their DecodeError says that
	// `plan` and `replay --file` take JSON lines).
	Schemas AvroSchemas
	// Keep, when set, names the columns kept in row images: the others
	// are validated and skipped without building values. The daemon
	// keeps the columns its rules read (rules.RuleSet.ColumnsRead), so
	// that a wide row costs little more than its bytes. nil keeps every
	// column. Flattened Debezium rows (FormatDebeziumFlat) keep every
	// column whatever Keep says.
	Keep *ColumnSet
}

// Decoded is the reusable output of Decoder.Decode. Decode resets and
// refills it; reusing one Decoded across calls avoids allocations, and
// lets Decode recognise the member names of
// the messages it read before (decode_keys.go), which it keeps in up to
// about 1 MB and forgets when used with a Decoder of another Keep.
//
// Events and their row images are owned by the Decoded: they are valid
// until the next Decode into the same Decoded, which overwrites the row
// slices. The strings in them stay valid after that for as long as the
// message value they were decoded from is unchanged (see Decode). Copy
// what must be kept longer.
type Decoded struct {
	// Events holds one event per row change, in message order.
	Events []rules.Event
	// Format is the format the message was decoded as (the detected one
	// when the decoder's format is FormatAuto; FormatAuto when nothing
	// could be detected).
	Format Format
	// Skip is non-empty, and Events empty, when the message carries no
	// row change; it is one of the Skip* constants.
	Skip string

	st decodeState
}

// DecodeError describes a message that cannot be decoded (a poison
// message). Retrying cannot help.
type DecodeError struct {
	// Format is the format the message was decoded as (FormatAuto when it
	// failed before the format was known).
	Format Format
	// Offset is the byte offset in the message value where the problem
	// was found, or -1 when it concerns the message as a whole.
	Offset int
	// Path is the JSON path of the offending field, such as
	// "payload.after.id" or "data[1].price"; empty for the top level.
	Path string
	// Reason says what is wrong.
	Reason string
	// Database and Table name the table of the message's row change when
	// the decoder knew it before finding the problem (an operation type
	// it does not know); empty otherwise. They never share the message's
	// memory.
	Database, Table string
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("cdc: decode ")
	if e.Format != FormatAuto {
		b.WriteString(e.Format.String())
		b.WriteByte(' ')
	}
	b.WriteString("message: ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	if e.Offset >= 0 {
		b.WriteString("at byte ")
		b.WriteString(strconv.Itoa(e.Offset))
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// span is a range of decodeState.cols holding one row image; lo < 0
// means the image is absent.
type span struct{ lo, hi int32 }

var absent = span{-1, -1}

func (s span) present() bool { return s.lo >= 0 }

// evRows are the row images of one pending event.
type evRows struct{ before, after span }

// decodeState is the scratch space of one Decoded.
type decodeState struct {
	sc       scanner
	keys     keyCache
	top      []field
	inner    []field
	topIdx   keyIndex
	innerIdx keyIndex
	// cols holds every parsed row; rows and event images are ranges of it.
	cols []rules.Column
	// rows holds the rows of arrays of objects (Canal data/old).
	rows     []span
	evRows   []evRows
	sources  []sourceInfo
	decimals []decimalCol
	kinds    []canalKind
	// keep is the Decoder's Keep during Decode.
	keep *ColumnSet
	// lastFile and lastGTID are the copies of the last event's binlog
	// file and GTID (see ownedCopy), made in strs.
	lastFile, lastGTID string
	// avro reads Avro bodies; avroText holds the values rendered from
	// them (see decodeState.text), jsonBuf the JSON of nested values.
	avro     avroReader
	avroText []byte
	jsonBuf  []byte
	// avroMemo and avroSpans let an after image reuse the values of the
	// before image (see avroRow).
	avroMemo  avroRowMemo
	avroSpans []int32
	strs      rules.StringArena
}

// Decode decodes one message value. pos gives the message's Kafka
// coordinates (or input line); it is copied into every event's Source,
// completed with the binlog position, GTID and source timestamp the
// format carries.
//
// A nil, empty or JSON null value is a tombstone (out.Skip is set, no
// error). A message that cannot be decoded returns a *DecodeError and
// leaves out without events.
//
// The events' strings are not copied out of value where no unescaping is
// needed: database and table names, column names and column values may
// share value's memory, so value must stay unchanged for as long as they,
// or ops planned from them (Op.Args), are in use. The daemon keeps a
// batch's message values unchanged until the batch is applied. The
// binlog file and GTID of Source, and errors, never share value's
// memory: they may be kept longer.
//
// A value whose first byte is 0 (which no JSON text starts with) is
// Confluent-framed Avro under FormatAuto, FormatAvro, FormatDebezium and
// FormatDebeziumFlat: it is read with the schema of its id in d.Schemas
// (decode_avro.go) and interpreted as below; under FormatAvro anything
// else is a DecodeError.
//
// Format detection (FormatAuto), from the top-level keys of the message
// or of the payload of a {"schema","payload"} envelope:
//   - "__op" or "__deleted": flattened Debezium row;
//   - "op" with "before", "after" or "source": Debezium;
//   - "isDdl", or "data" holding an array: Canal;
//   - "type" with "data", "database", "table" or "encrypted", or
//     "encrypted" alone: Maxwell;
//   - Debezium transaction markers ("status" with "event_count" or
//     "data_collections"), schema changes ("ddl" with "tableChanges" or
//     "databaseName") and heartbeats (only "ts_ms") are skipped;
//   - anything else is a DecodeError.
func (d *Decoder) Decode(value []byte, pos rules.Position, out *Decoded) error {
	out.Events = out.Events[:0]
	out.Format = d.Format
	out.Skip = ""
	st := &out.st
	st.evRows = st.evRows[:0]
	st.keep = d.Keep

	if len(value) > 0 && value[0] == avroMagic {
		switch d.Format {
		case FormatAuto, FormatAvro, FormatDebezium, FormatDebeziumFlat:
			return d.decodeAvro(value, pos, out)
		}
	}
	i := 0
	for i < len(value) && isSpace(value[i]) {
		i++
	}
	if i == len(value) {
		out.Skip = SkipTombstone
		return nil
	}
	// The message is read in place (see above): copying it would cost an
	// allocation as large as the message.
	s := unsafe.String(unsafe.SliceData(value), len(value))
	st.reset(s, value)
	sc := &st.sc
	sc.i = i
	if s[i] == 'n' {
		if strings.HasPrefix(s[i:], "null") && isBlank(s[i+4:]) {
			out.Skip = SkipTombstone
			return nil
		}
	}
	if d.Format == FormatAvro {
		return &DecodeError{Format: FormatAvro, Offset: 0, Reason: "message is not Confluent-framed Avro (starts with " + describeByte(value[0]) + ", not the magic byte 0)"}
	}
	if s[i] != '{' {
		return &DecodeError{Format: d.Format, Offset: i, Reason: "message is not a JSON object (starts with " + describeByte(s[i]) + ")"}
	}
	if !st.fields(&st.top, &st.topIdx, true) {
		return st.syntaxError(d.Format)
	}
	sc.skipWS()
	if sc.i != len(s) {
		return &DecodeError{Format: d.Format, Offset: sc.i, Reason: "unexpected data after the JSON object"}
	}

	err := d.interpret(pos, out)
	if err != nil {
		out.Events = out.Events[:0]
		return err
	}
	if out.Skip != "" {
		out.Events = out.Events[:0]
		return nil
	}
	out.attachImages()
	return nil
}

// attachImages gives the events their row images, once the column arena
// has stopped growing.
func (out *Decoded) attachImages() {
	st := &out.st
	for k := range out.Events {
		r := st.evRows[k]
		out.Events[k].Before = st.image(r.before)
		out.Events[k].After = st.image(r.after)
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isBlank(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isSpace(s[i]) {
			return false
		}
	}
	return true
}

func (st *decodeState) reset(s string, b []byte) {
	st.sc.reset(s, b)
	st.keys.reset(st.keep)
	st.top = st.top[:0]
	st.inner = st.inner[:0]
	st.topIdx.reset()
	st.innerIdx.reset()
	if st.cols == nil {
		// A present but empty image must be a non-nil Row.
		st.cols = make([]rules.Column, 0, 64)
	}
	st.cols = st.cols[:0]
	st.rows = st.rows[:0]
	st.sources = st.sources[:0]
	st.decimals = st.decimals[:0]
}

// image returns the row image of sp: nil when absent, else a slice of the
// arena whose capacity ends at its length, so that appending to one row
// never overwrites another.
func (st *decodeState) image(sp span) rules.Row {
	if !sp.present() {
		return nil
	}
	return rules.Row(st.cols[sp.lo:sp.hi:sp.hi])
}

func (st *decodeState) syntaxError(f Format) *DecodeError {
	sc := &st.sc
	return &DecodeError{Format: f, Offset: sc.errOff, Path: sc.errPath, Reason: sc.errMsg}
}

// interpret turns the parsed top-level fields into events or a skip.
func (d *Decoder) interpret(pos rules.Position, out *Decoded) error {
	st := &out.st
	m := msg{fields: st.top, idx: &st.topIdx}
	if d.Format == FormatAuto || d.Format == FormatDebezium || d.Format == FormatDebeziumFlat {
		if p := m.get(kPayload); p != nil && m.has(kSchema) && len(m.fields) == 2 {
			switch {
			case p.shape == shapeFields:
				m = msg{fields: st.inner, idx: &st.innerIdx, prefix: "payload.", schema: m.get(kSchema)}
			case p.val.Kind == rules.KindNull:
				out.Skip = SkipTombstone
				return nil
			default:
				return &DecodeError{Format: d.Format, Offset: int(p.off), Path: "payload", Reason: "envelope payload is not an object or null"}
			}
		}
	}
	f := d.Format
	if f == FormatAuto {
		var err error
		if f, err = m.detect(); err != nil {
			return err
		}
	}
	out.Format = f
	switch f {
	case FormatDebezium:
		return d.debezium(m, pos, out)
	case FormatDebeziumFlat:
		return d.flat(m, pos, out)
	case FormatMaxwell:
		return d.maxwell(m, pos, out)
	case FormatCanal:
		return d.canal(m, pos, out)
	}
	return &DecodeError{Format: f, Offset: -1, Reason: "unknown decoder format " + f.String()}
}

// addEvent appends an event whose row images are spans of the arena; Decode
// attaches the images once all events are known. The source position's
// strings are replaced by copies that do not share the message's memory.
func (out *Decoded) addEvent(op rules.Operation, db, table string, before, after span, src rules.Position) {
	st := &out.st
	src.BinlogFile = st.ownedCopy(&st.lastFile, src.BinlogFile)
	src.GTID = st.ownedCopy(&st.lastGTID, src.GTID)
	out.Events = append(out.Events, rules.Event{Database: db, Table: table, Operation: op, Source: src})
	out.st.evRows = append(out.st.evRows, evRows{before: before, after: after})
}

// resolveTable completes a database or table name missing from the
// message from TopicTables[topic], else from Table. It reports which one
// is still missing.
func (d *Decoder) resolveTable(topic, db, table string) (string, string, string) {
	if db == "" || table == "" {
		def := d.TopicTables[topic]
		if def == "" {
			def = d.Table
		}
		if def != "" {
			ddb, dtable, ok := strings.Cut(def, ".")
			if !ok {
				ddb, dtable = "", def
			}
			if table == "" {
				table = dtable
			}
			if db == "" {
				db = ddb
			}
		}
	}
	switch {
	case table == "":
		return db, table, "table"
	case db == "":
		return db, table, "database"
	}
	return db, table, ""
}

// ownedCopy returns a copy of s that shares no memory with the message,
// reusing *last, the previous copy, when it is equal: consecutive events
// mostly come from the same binlog file and often from the same
// transaction. Other copies are made in st.strs, a few kilobytes at a
// time: every event's GTID differs.
func (st *decodeState) ownedCopy(last *string, s string) string {
	if s == *last {
		return *last
	}
	if s == "" {
		return ""
	}
	*last = st.strs.CopyString(s)
	return *last
}

// maxQuotedOp bounds how much of an unknown operation type an error
// quotes.
const maxQuotedOp = 64

// unknownOp is the error of a message whose operation type (field, such
// as "op" or "type", at path) the decoder does not know: its row change
// cannot be planned, so it is poison rather than skipped. known lists the
// types that are. The table is resolved from db and table, as for a row
// change, so that the daemon can bump that table's fallback namespace.
func (d *Decoder) unknownOp(f Format, fd *field, path, text, known, topic, db, table string) *DecodeError {
	if len(text) > maxQuotedOp {
		text = text[:maxQuotedOp] + "..."
	}
	off := -1
	if fd != nil {
		off = int(fd.off)
	}
	e := &DecodeError{Format: f, Offset: off, Path: path,
		Reason: "unknown operation type " + strconv.Quote(text) + " (known: " + known + "): its row change cannot be planned"}
	if db, table, missing := d.resolveTable(topic, db, table); missing == "" {
		e.Database, e.Table = strings.Clone(db), strings.Clone(table)
	}
	return e
}

func (d *Decoder) missingTable(f Format, what, path, topic string) *DecodeError {
	where := "no table is configured for topic " + strconv.Quote(topic)
	if topic == "" {
		where = "no default table is configured"
	}
	return &DecodeError{Format: f, Offset: -1, Path: path, Reason: "missing " + what + " name: the message has none and " + where}
}

// parseInt64 reads an integer from a KindInt value or a string of digits
// (some producers quote numbers).
func parseInt64(v rules.Value) (int64, bool) {
	if v.Kind != rules.KindInt && v.Kind != rules.KindString {
		return 0, false
	}
	if n, ok := shortDigits(v.Text); ok {
		return n, true
	}
	n, err := strconv.ParseInt(v.Text, 10, 64)
	return n, err == nil
}

// shortDigits reads 1 to 18 ASCII digits, which cannot overflow an int64,
// much faster than strconv; ok is false for anything else (signs, longer
// numbers), which strconv must read.
func shortDigits(t string) (n int64, ok bool) {
	if len(t) == 0 || len(t) > 18 {
		return 0, false
	}
	for i := 0; i < len(t); i++ {
		d := t[i] - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int64(d)
	}
	return n, true
}
