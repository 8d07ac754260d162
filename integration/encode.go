package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
)

// Format is a CDC message format the workload publishes, shaped like the
// output of the connector it is named after.
type Format string

const (
	// Debezium is the MySQL connector's envelope without schemas
	// (value.converter.schemas.enable=false): before, after, source, op,
	// ts_ms. Messages are keyed by the primary key ({"id":N}); a delete is
	// followed by a tombstone, and a primary-key change is published as a
	// delete, a tombstone and a create. DECIMAL columns are strings
	// (decimal.handling.mode=string), DATETIME columns epoch milliseconds.
	Debezium Format = "debezium"
	// DebeziumSchema is Debezium with schemas.enable=true: value and key
	// are {"schema":…,"payload":…}.
	DebeziumSchema Format = "debezium-schema"
	// DebeziumFlat is ExtractNewRecordState with add.fields=op,db,table,
	// source.ts_ms and delete.handling.mode=rewrite: the row itself plus
	// __op, __db, __table, __source_ts_ms and __deleted ("true"/"false"),
	// keyed like Debezium, no tombstones. There is no before image.
	DebeziumFlat Format = "debezium-flat"
	// DebeziumFlatRow is ExtractNewRecordState in rewrite mode without
	// added fields: the row plus __deleted only. The daemon takes its
	// table from the topic → table map.
	DebeziumFlatRow Format = "debezium-flat-row"
	// Maxwell is Maxwell's output: data, old (changed columns only),
	// xid/xoffset/commit per transaction, position "file:pos". Messages are
	// partitioned by table (producer_partition_by=table; the key is
	// {"database","table"}).
	Maxwell Format = "maxwell"
	// DebeziumAvro is Debezium with Kafka Connect's AvroConverter and a
	// schema registry: the envelope and the key ({id} or the primary key)
	// in Avro, framed with their schema ids (registered on first use in
	// an AvroRegistry); DECIMAL columns as Connect Decimals
	// (decimal.handling.mode=precise), DATETIME as epoch milliseconds; a
	// delete is followed by a tombstone.
	DebeziumAvro Format = "debezium-avro"
	// Canal is Canal's flat message: every value a string, types in
	// mysqlType/sqlType, and consecutive changes of one kind to one table
	// within a transaction in a single message. Messages are partitioned
	// by table (the key is "db.table"), since one holds several rows.
	Canal Format = "canal"
)

// Formats lists every Format.
var Formats = []Format{Debezium, DebeziumSchema, DebeziumFlat, DebeziumFlatRow, Maxwell, Canal, DebeziumAvro}

// ConfigFormat returns the daemon's kafka.format value for f: the
// decoders' format that reads f's messages.
func (f Format) ConfigFormat() string { return f.Decoder().String() }

// Decoder returns the decoders' format that reads f's messages
// (FormatAuto, which detects the format, for one not in Formats).
func (f Format) Decoder() decode.Format {
	switch f {
	case Debezium, DebeziumSchema:
		return decode.FormatDebezium
	case DebeziumFlat, DebeziumFlatRow:
		return decode.FormatDebeziumFlat
	case Maxwell:
		return decode.FormatMaxwell
	case Canal:
		return decode.FormatCanal
	case DebeziumAvro:
		return decode.FormatAvro
	}
	return decode.FormatAuto
}

// Avro reports whether f's messages are Avro, read through a schema
// registry.
func (f Format) Avro() bool { return f == DebeziumAvro }

// HasBefore reports whether f carries the before image of an update.
// Without it, an update that moves a row from one set or counter key to
// another cannot be followed (the old key is unknown), so the workload
// makes no such change for these formats (WorkloadOptions.KeyMoves).
func (f Format) HasBefore() bool { return f != DebeziumFlat && f != DebeziumFlatRow }

// SupportsSnapshot reports whether f has a snapshot-read form; Canal has
// none.
func (f Format) SupportsSnapshot() bool { return f != Canal }

// Change is one committed row change, as a CDC connector reports it.
type Change struct {
	Table *Table
	// Event holds the logical database, table, operation, images and the
	// source position (binlog file/pos, timestamp).
	Event rules.Event
	// Tx numbers the transaction (increasing); Row is the change's index
	// within it and Last marks its final change.
	Tx   int64
	Row  int
	Last bool
	// SnapshotLast marks the last row of a snapshot.
	SnapshotLast bool
}

// pkChanged reports whether an update changed the primary key.
func (c *Change) pkChanged() bool {
	if c.Event.Operation != rules.Update {
		return false
	}
	for _, k := range c.Table.PK {
		b, _ := c.Event.Before.Get(k)
		a, _ := c.Event.After.Get(k)
		if a != b {
			return true
		}
	}
	return false
}

// Events returns the row changes a decoder finds in f's messages for
// changes: in the Debezium family a primary-key change is a delete and an
// insert, flattened rows have no before image, and a flattened row without
// __op is an update.
func (f Format) Events(changes []Change) []rules.Event {
	var out []rules.Event
	for i := range changes {
		c := &changes[i]
		parts := []rules.Event{c.Event}
		if f != Maxwell && f != Canal && c.pkChanged() {
			del, ins := c.Event, c.Event
			del.Operation, del.After = rules.Delete, nil
			ins.Operation, ins.Before = rules.Insert, nil
			parts = []rules.Event{del, ins}
		}
		for _, ev := range parts {
			if !f.HasBefore() && ev.Operation != rules.Delete {
				ev.Before = nil
			}
			if f == DebeziumFlatRow && ev.Operation != rules.Delete {
				ev.Operation = rules.Update
			}
			out = append(out, ev)
		}
	}
	return out
}

// OutMessage is one Kafka message to publish; a nil Value is a tombstone.
type OutMessage struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string]string
	// Time is the record's timestamp; zero means when it is published.
	Time time.Time
}

// TopicFunc names the topic of a table's changes.
type TopicFunc func(t *Table) string

// DefaultTopic names topics like Debezium does with topic.prefix "cdc":
// "cdc.<database>.<table>".
func DefaultTopic(t *Table) string { return "cdc." + t.Database + "." + t.Name }

// Encode turns one transaction's changes into messages in format f, in
// commit order. reg registers and encodes the schemas of DebeziumAvro; it
// may be nil for the other formats.
func Encode(f Format, tx []Change, topic TopicFunc, reg *AvroRegistry) ([]OutMessage, error) {
	if topic == nil {
		topic = DefaultTopic
	}
	switch f {
	case Canal:
		return encodeCanalTx(tx, topic)
	case Maxwell:
		return encodeMaxwellTx(tx, topic)
	case Debezium, DebeziumSchema, DebeziumFlat, DebeziumFlatRow, DebeziumAvro:
		return encodeDebeziumTx(f, tx, topic, reg)
	}
	return nil, fmt.Errorf("integration: unknown format %q", f)
}

// encodeCanalTx encodes tx as Canal does: one message for each run of
// changes of the same table and operation.
func encodeCanalTx(tx []Change, topic TopicFunc) ([]OutMessage, error) {
	var out []OutMessage
	for i := 0; i < len(tx); {
		j := i + 1
		for j < len(tx) && tx[j].Table == tx[i].Table && tx[j].Event.Operation == tx[i].Event.Operation {
			j++
		}
		m, err := encodeCanal(tx[i:j])
		if err != nil {
			return nil, err
		}
		out = append(out, OutMessage{Topic: topic(tx[i].Table), Key: []byte(tx[i].Table.Qualified()), Value: m})
		i = j
	}
	return out, nil
}

// encodeMaxwellTx encodes tx as Maxwell does: one message a change, keyed
// by its database and table.
func encodeMaxwellTx(tx []Change, topic TopicFunc) ([]OutMessage, error) {
	var out []OutMessage
	for i := range tx {
		c := &tx[i]
		key, err := marshal(obj{{"database", c.Event.Database}, {"table", c.Event.Table}})
		if err != nil {
			return nil, err
		}
		val, err := encodeMaxwell(c)
		if err != nil {
			return nil, err
		}
		out = append(out, OutMessage{Topic: topic(c.Table), Key: key, Value: val})
	}
	return out, nil
}

// encodeDebeziumTx encodes tx in one of the Debezium formats f: one
// message a change (two for a primary-key change), and a tombstone after a
// delete where Debezium sends one.
func encodeDebeziumTx(f Format, tx []Change, topic TopicFunc, reg *AvroRegistry) ([]OutMessage, error) {
	var out []OutMessage
	for i := range tx {
		for _, c := range debeziumParts(tx[i]) {
			msgs, err := encodeDebeziumChange(f, &c, topic(c.Table), reg)
			if err != nil {
				return nil, err
			}
			out = append(out, msgs...)
		}
	}
	return out, nil
}

// debeziumParts returns c as Debezium reports it: a primary-key change as
// a delete of the old key and a create of the new one, else c alone.
func debeziumParts(c Change) []Change {
	if !c.pkChanged() {
		return []Change{c}
	}
	del, ins := c, c
	del.Event.Operation, del.Event.After = rules.Delete, nil
	ins.Event.Operation, ins.Event.Before = rules.Insert, nil
	return []Change{del, ins}
}

// encodeDebeziumChange encodes one change in the Debezium format f for
// topic: its message, then its tombstone where Debezium sends one.
func encodeDebeziumChange(f Format, c *Change, topic string, reg *AvroRegistry) ([]OutMessage, error) {
	if f == DebeziumAvro {
		key, val, err := encodeDebeziumAvro(reg, c, topic)
		if err != nil {
			return nil, err
		}
		out := []OutMessage{{Topic: topic, Key: key, Value: val}}
		if c.Event.Operation == rules.Delete {
			out = append(out, OutMessage{Topic: topic, Key: key}) // tombstone
		}
		return out, nil
	}
	key, err := debeziumKey(c, f == DebeziumSchema)
	if err != nil {
		return nil, err
	}
	var val []byte
	switch f {
	case Debezium, DebeziumSchema:
		val, err = encodeDebezium(c, f == DebeziumSchema)
	case DebeziumFlat:
		val, err = encodeFlat(c, true)
	case DebeziumFlatRow:
		val, err = encodeFlat(c, false)
	}
	if err != nil {
		return nil, err
	}
	out := []OutMessage{{Topic: topic, Key: key, Value: val}}
	if c.Event.Operation == rules.Delete && (f == Debezium || f == DebeziumSchema) {
		out = append(out, OutMessage{Topic: topic, Key: key}) // tombstone
	}
	return out, nil
}

// obj is a JSON object whose keys keep their order.
type obj []field

type field struct {
	k string
	v any
}

// MarshalJSON writes the fields in order.
func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(f.k)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", f.k, err)
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("integration: encode: %w", err)
	}
	return b, nil
}

// renderFunc renders one column value as JSON.
type renderFunc func(col ColumnDef, v rules.Value) (any, error)

// typedValue renders values as Maxwell does: numbers (DECIMAL included)
// as their exact digits, text as strings, NULL as null.
func typedValue(_ ColumnDef, v rules.Value) (any, error) {
	switch v.Kind {
	case rules.KindNull:
		return nil, nil
	case rules.KindInt, rules.KindFloat, rules.KindJSON:
		return json.RawMessage(v.Text), nil
	case rules.KindBool:
		return v.Text == "1", nil
	}
	return v.Text, nil
}

// debeziumValue renders values as Debezium's JsonConverter does with
// decimal.handling.mode=string: DECIMAL as a string, DATETIME as epoch
// milliseconds.
func debeziumValue(col ColumnDef, v rules.Value) (any, error) {
	switch {
	case v.Kind == rules.KindNull:
		return nil, nil
	case col.Logical == "io.debezium.time.Timestamp":
		t, err := time.Parse(time.DateTime, v.Text)
		if err != nil {
			return nil, fmt.Errorf("integration: column %s: %w", col.Name, err)
		}
		return t.UnixMilli(), nil
	case v.Kind == rules.KindFloat:
		return v.Text, nil
	}
	return typedValue(col, v)
}

// stringValue renders values as Canal does: a string, or null.
func stringValue(_ ColumnDef, v rules.Value) (any, error) {
	if v.Kind == rules.KindNull {
		return nil, nil
	}
	return v.Text, nil
}

// rowObj renders a row image (nil stays null).
func rowObj(t *Table, r rules.Row, render renderFunc) (any, error) {
	if r == nil {
		return nil, nil
	}
	o := make(obj, 0, len(r))
	for _, c := range r {
		col, _ := t.Column(c.Name)
		v, err := render(col, c.Value)
		if err != nil {
			return nil, err
		}
		o = append(o, field{c.Name, v})
	}
	return o, nil
}

// changedObj renders the before values of the columns an update changed
// (Maxwell's and Canal's "old").
func changedObj(t *Table, b, a rules.Row, render renderFunc) (obj, error) {
	o := obj{}
	for _, c := range a {
		old, ok := b.Get(c.Name)
		if ok && old == c.Value {
			continue
		}
		col, _ := t.Column(c.Name)
		v, err := render(col, old)
		if err != nil {
			return nil, err
		}
		o = append(o, field{c.Name, v})
	}
	return o, nil
}

// image returns the row a change is about: after, or before for a delete.
func (c *Change) image() rules.Row {
	if c.Event.After != nil {
		return c.Event.After
	}
	return c.Event.Before
}

func debeziumOp(op rules.Operation) string {
	switch op {
	case rules.Insert:
		return "c"
	case rules.Update:
		return "u"
	case rules.Delete:
		return "d"
	case rules.Read:
		return "r"
	}
	return "t"
}

// connectorName is the topic prefix Debezium would be configured with.
const connectorName = "cdc"

func debeziumKey(c *Change, withSchema bool) ([]byte, error) {
	row := c.image()
	payload := obj{}
	var fields []any
	for _, k := range c.Table.PK {
		col, _ := c.Table.Column(k)
		v, _ := row.Get(k)
		rv, err := debeziumValue(col, v)
		if err != nil {
			return nil, err
		}
		payload = append(payload, field{k, rv})
		fields = append(fields, obj{{"type", col.Connect}, {"optional", false}, {"field", k}})
	}
	if !withSchema {
		return marshal(payload)
	}
	schema := obj{{"type", "struct"}, {"fields", fields}, {"optional", false},
		{"name", connectorName + "." + c.Event.Database + "." + c.Event.Table + ".Key"}}
	return marshal(obj{{"schema", schema}, {"payload", payload}})
}

func encodeDebezium(c *Change, withSchema bool) ([]byte, error) {
	ev := &c.Event
	snapshot := "false"
	var thread any = int64(7)
	serverID := sourceServerID(ev.Source)
	if ev.Operation == rules.Read {
		snapshot = "true"
		if c.SnapshotLast {
			snapshot = "last"
		}
		thread, serverID = nil, 0
	}
	before, err := rowObj(c.Table, ev.Before, debeziumValue)
	if err != nil {
		return nil, err
	}
	after, err := rowObj(c.Table, ev.After, debeziumValue)
	if err != nil {
		return nil, err
	}
	source := obj{
		{"version", "2.7.3.Final"}, {"connector", "mysql"}, {"name", connectorName},
		{"ts_ms", ev.Source.TsMs}, {"snapshot", snapshot}, {"db", ev.Database}, {"sequence", nil},
		{"table", ev.Table}, {"server_id", serverID}, {"gtid", nil},
		{"file", ev.Source.BinlogFile}, {"pos", ev.Source.BinlogPos}, {"row", int64(c.Row)},
		{"thread", thread}, {"query", nil},
	}
	payload := obj{
		{"before", before}, {"after", after}, {"source", source},
		{"op", debeziumOp(ev.Operation)}, {"ts_ms", ev.Source.TsMs + 3}, {"transaction", nil},
	}
	if !withSchema {
		return marshal(payload)
	}
	recordName := connectorName + "." + ev.Database + "." + ev.Table
	var cols []any
	for _, col := range c.Table.Columns {
		f := obj{{"type", col.Connect}, {"optional", col.Null}}
		if col.Logical != "" {
			f = append(f, field{"name", col.Logical}, field{"version", 1})
		}
		cols = append(cols, append(f, field{"field", col.Name}))
	}
	rowSchema := func(name string) obj {
		return obj{{"type", "struct"}, {"fields", cols}, {"optional", true}, {"name", recordName + ".Value"}, {"field", name}}
	}
	str := func(name string, optional bool) obj {
		return obj{{"type", "string"}, {"optional", optional}, {"field", name}}
	}
	i64 := func(name string, optional bool) obj {
		return obj{{"type", "int64"}, {"optional", optional}, {"field", name}}
	}
	sourceSchema := obj{{"type", "struct"}, {"fields", []any{
		str("version", false), str("connector", false), str("name", false), i64("ts_ms", false),
		obj{{"type", "string"}, {"optional", true}, {"name", "io.debezium.data.Enum"}, {"version", 1},
			{"parameters", obj{{"allowed", "true,last,false,incremental"}}}, {"default", "false"}, {"field", "snapshot"}},
		str("db", false), str("sequence", true), str("table", true), i64("server_id", false), str("gtid", true),
		str("file", false), i64("pos", false), obj{{"type", "int32"}, {"optional", false}, {"field", "row"}},
		i64("thread", true), str("query", true),
	}}, {"optional", false}, {"name", "io.debezium.connector.mysql.Source"}, {"field", "source"}}
	envelope := obj{{"type", "struct"}, {"fields", []any{
		rowSchema("before"), rowSchema("after"), sourceSchema, str("op", false), i64("ts_ms", true),
		obj{{"type", "struct"}, {"fields", []any{str("id", false), i64("total_order", false), i64("data_collection_order", false)}},
			{"optional", true}, {"name", "event.block"}, {"version", 1}, {"field", "transaction"}},
	}}, {"optional", false}, {"name", recordName + ".Envelope"}, {"version", 1}}
	return marshal(obj{{"schema", envelope}, {"payload", payload}})
}

func encodeFlat(c *Change, metadata bool) ([]byte, error) {
	ev := &c.Event
	deleted := "false"
	if ev.Operation == rules.Delete {
		deleted = "true"
	}
	row, err := rowObj(c.Table, c.image(), debeziumValue)
	if err != nil {
		return nil, err
	}
	o := row.(obj)
	if metadata {
		o = append(o, field{"__op", debeziumOp(ev.Operation)}, field{"__db", ev.Database}, field{"__table", ev.Table},
			field{"__source_ts_ms", ev.Source.TsMs})
	}
	return marshal(append(o, field{"__deleted", deleted}))
}

func encodeMaxwell(c *Change) ([]byte, error) {
	ev := &c.Event
	o := obj{{"database", ev.Database}, {"table", ev.Table}}
	switch ev.Operation {
	case rules.Insert:
		o = append(o, field{"type", "insert"})
	case rules.Update:
		o = append(o, field{"type", "update"})
	case rules.Delete:
		o = append(o, field{"type", "delete"})
	case rules.Read:
		o = append(o, field{"type", "bootstrap-insert"})
	default:
		return nil, fmt.Errorf("integration: maxwell: cannot encode %s", ev.Operation)
	}
	o = append(o, field{"ts", ev.Source.TsMs / 1000})
	if ev.Operation != rules.Read {
		o = append(o, field{"xid", 1000 + c.Tx})
		if c.Last {
			o = append(o, field{"commit", true})
		} else {
			o = append(o, field{"xoffset", int64(c.Row)})
		}
		o = append(o, field{"position", ev.Source.BinlogFile + ":" + strconv.FormatInt(ev.Source.BinlogPos, 10)},
			field{"server_id", sourceServerID(ev.Source)}, field{"thread_id", int64(7)})
	}
	var pk []any
	for _, k := range c.Table.PK {
		v, _ := c.image().Get(k)
		rv, err := typedValue(ColumnDef{}, v)
		if err != nil {
			return nil, err
		}
		pk = append(pk, rv)
	}
	o = append(o, field{"primary_key", pk}, field{"primary_key_columns", c.Table.PK})
	data, err := rowObj(c.Table, c.image(), typedValue)
	if err != nil {
		return nil, err
	}
	o = append(o, field{"data", data})
	if ev.Operation == rules.Update {
		old, err := changedObj(c.Table, ev.Before, ev.After, typedValue)
		if err != nil {
			return nil, err
		}
		o = append(o, field{"old", old})
	}
	return marshal(o)
}

// encodeCanal encodes changes of one table and one operation, in order, as
// one flat message.
func encodeCanal(cs []Change) ([]byte, error) {
	first := &cs[0]
	t := first.Table
	var typ string
	switch first.Event.Operation {
	case rules.Insert:
		typ = "INSERT"
	case rules.Update:
		typ = "UPDATE"
	case rules.Delete:
		typ = "DELETE"
	default:
		return nil, fmt.Errorf("integration: canal: cannot encode %s", first.Event.Operation)
	}
	var data, old []any
	for i := range cs {
		c := &cs[i]
		row, err := rowObj(t, c.image(), stringValue)
		if err != nil {
			return nil, err
		}
		data = append(data, row)
		if c.Event.Operation == rules.Update {
			o, err := changedObj(t, c.Event.Before, c.Event.After, stringValue)
			if err != nil {
				return nil, err
			}
			old = append(old, o)
		}
	}
	mysqlType, sqlType := obj{}, obj{}
	for _, col := range t.Columns {
		mysqlType = append(mysqlType, field{col.Name, col.SQLType})
		sqlType = append(sqlType, field{col.Name, col.JDBC})
	}
	var oldField any
	if old != nil {
		oldField = old
	}
	return marshal(obj{
		{"data", data}, {"database", first.Event.Database}, {"es", first.Event.Source.TsMs},
		{"id", first.Tx}, {"isDdl", false}, {"mysqlType", mysqlType}, {"old", oldField},
		{"pkNames", t.PK}, {"sql", ""}, {"sqlType", sqlType}, {"table", first.Event.Table},
		{"ts", first.Event.Source.TsMs + 5}, {"type", typ},
	})
}

// sourceServerID is the server_id a connector reports for a change: the
// one the workload read from its server, 1 when it has none.
func sourceServerID(pos rules.Position) int64 {
	if pos.ServerID == 0 {
		return 1
	}
	return int64(pos.ServerID)
}
