// Package debeziumavro writes what Debezium's MySQL connector writes with
// Kafka Connect's AvroConverter and a schema registry, for tests and the
// demo: a table's envelope, key and flattened-row schemas (shaped as the
// converter registers them: optional columns as unions with null, Connect
// names as connect.* properties, the connector's Source block), registered
// under the topic's subjects, and messages encoded with the hamba/avro
// encoder and framed as the Confluent serializer frames them (magic byte
// 0, the schema id, the body).
//
// It is not the daemon's decoder: the daemon reads Avro messages with
// package cdc (the schema registry tests in consumer and the integration
// workload publish what this package encodes).
package debeziumavro

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// The Source block of Debezium 2.7's MySQL connector and its transaction
// block, as the AvroConverter registers them.
var (
	//go:embed source.avsc
	sourceSchema string
	//go:embed block.avsc
	blockSchema string
)

// Avro types of MySQL columns, as the connector maps them with its
// default modes.
const (
	Int    = `"int"`                                 // INT, MEDIUMINT
	Int16  = `{"type":"int","connect.type":"int16"}` // SMALLINT, TINYINT (TINYINT(1) too)
	Long   = `"long"`                                // BIGINT
	String = `"string"`                              // CHAR, VARCHAR, TEXT, ENUM (io.debezium.data.Enum)
	Double = `"double"`                              // DOUBLE
	Bool   = `"boolean"`                             // BIT(1), BOOLEAN
	Bytes  = `"bytes"`                               // BINARY, BLOB
	// Timestamp is DATETIME(0-3): epoch milliseconds.
	Timestamp = `{"type":"long","connect.version":1,"connect.name":"io.debezium.time.Timestamp"}`
)

// Decimal is DECIMAL(precision, scale) with decimal.handling.mode=precise:
// Connect's Decimal, the unscaled integer in bytes.
func Decimal(precision, scale int) string {
	return fmt.Sprintf(`{"type":"bytes","scale":%d,"precision":%d,"connect.version":1,"connect.parameters":{"scale":"%d","connect.decimal.precision":"%d"},"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}`,
		scale, precision, scale, precision)
}

// Column is one column: its name, its Avro type (one of the constants or
// Decimal), and whether it is nullable.
type Column struct {
	Name     string
	Type     string
	Optional bool
}

// Table is one table's change topic.
type Table struct {
	// Topic is the topic, "<topic.prefix>.<db>.<table>": the namespace
	// of the records and the base of the subjects.
	Topic   string
	Columns []Column
	// Key lists the columns of the message key (the primary key).
	Key []string
}

func (t Table) column(name string) (Column, bool) {
	for _, c := range t.Columns {
		if c.Name == name {
			return c, true
		}
	}
	return Column{}, false
}

func fieldJSON(c Column) string {
	if c.Optional {
		return fmt.Sprintf(`{"name":%q,"type":["null",%s],"default":null}`, c.Name, c.Type)
	}
	return fmt.Sprintf(`{"name":%q,"type":%s}`, c.Name, c.Type)
}

func recordJSON(name, namespace string, fields []string) string {
	return fmt.Sprintf(`{"type":"record","name":%q,"namespace":%q,"fields":[%s],"connect.name":%q}`,
		name, namespace, strings.Join(fields, ","), namespace+"."+name)
}

// ValueSchema is the row record, "<topic>.Value".
func (t Table) ValueSchema() string {
	fields := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		fields[i] = fieldJSON(c)
	}
	return recordJSON("Value", t.Topic, fields)
}

// EnvelopeSchema is the change-event envelope, "<topic>.Envelope".
func (t Table) EnvelopeSchema() string {
	return fmt.Sprintf(`{"type":"record","name":"Envelope","namespace":%q,"fields":[`+
		`{"name":"before","type":["null",%s],"default":null},`+
		`{"name":"after","type":["null","Value"],"default":null},`+
		`{"name":"source","type":%s},`+
		`{"name":"transaction","type":["null",%s],"default":null},`+
		`{"name":"op","type":"string"},`+
		`{"name":"ts_ms","type":["null","long"],"default":null},`+
		`{"name":"ts_us","type":["null","long"],"default":null},`+
		`{"name":"ts_ns","type":["null","long"],"default":null}],`+
		`"connect.version":2,"connect.name":%q}`,
		t.Topic, t.ValueSchema(), sourceSchema, blockSchema, t.Topic+".Envelope")
}

// KeySchema is the message key record, "<topic>.Key".
func (t Table) KeySchema() (string, error) {
	fields := make([]string, len(t.Key))
	for i, k := range t.Key {
		c, ok := t.column(k)
		if !ok {
			return "", fmt.Errorf("debeziumavro: %s: key column %q is not a column", t.Topic, k)
		}
		c.Optional = false
		fields[i] = fieldJSON(c)
	}
	return recordJSON("Key", t.Topic, fields), nil
}

// FlatSchema is the row as ExtractNewRecordState writes it with
// add.fields=op,db,table,source.ts_ms and delete.handling.mode=rewrite.
func (t Table) FlatSchema() string {
	fields := make([]string, 0, len(t.Columns)+5)
	for _, c := range t.Columns {
		fields = append(fields, fieldJSON(c))
	}
	for _, f := range []Column{{"__op", String, true}, {"__db", String, true}, {"__table", String, true},
		{"__source_ts_ms", Long, true}, {"__deleted", String, true}} {
		fields = append(fields, fieldJSON(f))
	}
	return recordJSON("Value", t.Topic, fields)
}

// Source is the source block of one change.
type Source struct {
	// Name is the connector's topic.prefix.
	Name string
	// TsMs is when the change was made in the database.
	TsMs int64
	// Snapshot is "false" for a binlog change, "true" or "last" for a
	// snapshot row.
	Snapshot string
	DB       string
	Table    string
	ServerID int64
	// GTID is "" without GTIDs.
	GTID string
	File string
	Pos  int64
	Row  int32
	// Thread is 0 in snapshot rows (written as null).
	Thread int64
}

// Encoder encodes one table's messages with the schemas registered for
// it. It is safe for concurrent use.
type Encoder struct {
	table                     Table
	api                       avro.API
	envelope, key, flat       avro.Schema
	envelopeID, keyID, flatID int
}

// Register registers t's envelope (or, with flat, its flattened row)
// schema under subject "<topic>-value" and its key schema under
// "<topic>-key", as the converter does on the connector's first message,
// and returns the table's encoder.
func Register(ctx context.Context, cl *sr.Client, t Table, flat bool) (*Encoder, error) {
	keyText, err := t.KeySchema()
	if err != nil {
		return nil, err
	}
	valueText := t.EnvelopeSchema()
	if flat {
		valueText = t.FlatSchema()
	}
	e := &Encoder{table: t, api: avro.Config{}.Freeze()}
	// Each schema is parsed with a cache of its own: evolved schemas of a
	// topic reuse its record names.
	if e.key, err = avro.ParseWithCache(keyText, "", &avro.SchemaCache{}); err != nil {
		return nil, fmt.Errorf("debeziumavro: %s key schema: %w", t.Topic, err)
	}
	value, err := avro.ParseWithCache(valueText, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: %s value schema: %w", t.Topic, err)
	}
	ks, err := cl.CreateSchema(ctx, t.Topic+"-key", sr.Schema{Schema: keyText})
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: register %s-key: %w", t.Topic, err)
	}
	vs, err := cl.CreateSchema(ctx, t.Topic+"-value", sr.Schema{Schema: valueText})
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: register %s-value: %w", t.Topic, err)
	}
	e.keyID = ks.ID
	if flat {
		e.flat, e.flatID = value, vs.ID
	} else {
		e.envelope, e.envelopeID = value, vs.ID
	}
	return e, nil
}

// IDs returns the registry ids of the value and key schemas.
func (e *Encoder) IDs() (value, key int) {
	if e.flat != nil {
		return e.flatID, e.keyID
	}
	return e.envelopeID, e.keyID
}

// Frame prepends the Confluent header (magic byte 0, the schema id) to
// an Avro body.
func Frame(id int, body []byte) []byte {
	out := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(out[1:], uint32(id))
	return append(out, body...)
}

// Row values are Go values of the columns' types: int64 (Long,
// Timestamp), int32 (Int, Int16), string, bool, []byte, float64, and for
// a Decimal a *big.Rat or its decimal text; nil is NULL.

// Envelope encodes a change event: op "c", "u", "d", "r" or "t", the
// images (nil when absent), the source block and the connector's ts_ms.
func (e *Encoder) Envelope(op string, before, after map[string]any, src Source, tsMs int64) ([]byte, error) {
	if e.envelope == nil {
		return nil, fmt.Errorf("debeziumavro: %s was registered with flattened rows", e.table.Topic)
	}
	b, err := e.image(before)
	if err != nil {
		return nil, err
	}
	a, err := e.image(after)
	if err != nil {
		return nil, err
	}
	var gtid, thread any
	if src.GTID != "" {
		gtid = src.GTID
	}
	if src.Thread != 0 {
		thread = src.Thread
	}
	v := map[string]any{
		"before": b, "after": a,
		"source": map[string]any{
			"version": "2.7.3.Final", "connector": "mysql", "name": src.Name, "ts_ms": src.TsMs,
			"snapshot": src.Snapshot, "db": src.DB, "sequence": nil, "ts_us": nil, "ts_ns": nil,
			"table": src.Table, "server_id": src.ServerID, "gtid": gtid, "file": src.File,
			"pos": src.Pos, "row": src.Row, "thread": thread, "query": nil,
		},
		"transaction": nil, "op": op, "ts_ms": tsMs, "ts_us": nil, "ts_ns": nil,
	}
	body, err := e.api.Marshal(e.envelope, v)
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: %s envelope: %w", e.table.Topic, err)
	}
	return Frame(e.envelopeID, body), nil
}

// Flat encodes a flattened row: op as __op, deleted as __deleted.
func (e *Encoder) Flat(row map[string]any, op, db, table string, sourceTsMs int64, deleted bool) ([]byte, error) {
	if e.flat == nil {
		return nil, fmt.Errorf("debeziumavro: %s was registered with envelopes", e.table.Topic)
	}
	v, err := e.values(row)
	if err != nil {
		return nil, err
	}
	v["__op"], v["__db"], v["__table"], v["__source_ts_ms"] = op, db, table, sourceTsMs
	v["__deleted"] = strconv.FormatBool(deleted)
	body, err := e.api.Marshal(e.flat, v)
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: %s row: %w", e.table.Topic, err)
	}
	return Frame(e.flatID, body), nil
}

// Key encodes the message key of row (the key columns' values).
func (e *Encoder) Key(row map[string]any) ([]byte, error) {
	v := make(map[string]any, len(e.table.Key))
	for _, k := range e.table.Key {
		c, _ := e.table.column(k)
		x, err := value(c, row[k])
		if err != nil {
			return nil, err
		}
		v[k] = x
	}
	body, err := e.api.Marshal(e.key, v)
	if err != nil {
		return nil, fmt.Errorf("debeziumavro: %s key: %w", e.table.Topic, err)
	}
	return Frame(e.keyID, body), nil
}

// image wraps a row image as the union branch of before/after.
func (e *Encoder) image(row map[string]any) (any, error) {
	if row == nil {
		return nil, nil
	}
	v, err := e.values(row)
	if err != nil {
		return nil, err
	}
	return map[string]any{e.table.Topic + ".Value": v}, nil
}

// values converts a row's values to what the encoder takes.
func (e *Encoder) values(row map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(e.table.Columns))
	for _, c := range e.table.Columns {
		v, err := value(c, row[c.Name])
		if err != nil {
			return nil, err
		}
		out[c.Name] = v
	}
	return out, nil
}

// value converts a Decimal given as text to a *big.Rat, and checks that
// NULL goes to a nullable column.
func value(c Column, v any) (any, error) {
	if v == nil {
		if !c.Optional {
			return nil, fmt.Errorf("debeziumavro: column %s is not nullable", c.Name)
		}
		return nil, nil
	}
	if s, ok := v.(string); ok && strings.Contains(c.Type, "org.apache.kafka.connect.data.Decimal") {
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			return nil, fmt.Errorf("debeziumavro: column %s: %q is not a decimal", c.Name, s)
		}
		return r, nil
	}
	return v, nil
}
