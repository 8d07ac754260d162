package decode

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/decode/*.golden from the decoder's output")

// fixtureLine returns line n (1-based) of testdata/decode/file.
func fixtureLine(t testing.TB, file string, n int) string {
	t.Helper()
	lines := fixtureLines(t, file)
	if n < 1 || n > len(lines) {
		t.Fatalf("%s has no line %d", file, n)
	}
	return lines[n-1]
}

func fixtureLines(t testing.TB, file string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "decode", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// want describes the expected decoding of one message.
type want struct {
	format Format
	skip   string
	events []wantEvent
	// errHas lists substrings of the expected error; nil means no error.
	errHas []string
}

type wantEvent struct {
	op     rules.Operation
	table  string // "db.table"
	before string // renderRow form; "nil" for an absent image, "" to not check
	after  string
	src    rules.Position // checked when non-zero
}

// renderRow renders a row as "name=kind:text ..." ("nil" when absent).
func renderRow(r rules.Row) string {
	if r == nil {
		return "nil"
	}
	var b strings.Builder
	for i, c := range r {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s:%s", c.Name, c.Value.Kind, c.Value.Text)
	}
	return b.String()
}

func checkDecode(t *testing.T, d *Decoder, value string, pos rules.Position, w want) {
	t.Helper()
	var out Decoded
	var in []byte
	if value != "<nil>" {
		in = []byte(value)
	}
	err := d.Decode(in, pos, &out)
	if w.errHas != nil {
		if err == nil {
			t.Fatalf("Decode succeeded (skip %q, %d events), want error containing %q", out.Skip, len(out.Events), w.errHas)
		}
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error %T %v is not a *DecodeError", err, err)
		}
		for _, s := range w.errHas {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not contain %q", err, s)
			}
		}
		if len(out.Events) != 0 {
			t.Errorf("error left %d events", len(out.Events))
		}
		return
	}
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if out.Format != w.format {
		t.Errorf("format = %v, want %v", out.Format, w.format)
	}
	if out.Skip != w.skip {
		t.Errorf("skip = %q, want %q", out.Skip, w.skip)
	}
	if len(out.Events) != len(w.events) {
		t.Fatalf("got %d events, want %d: %+v", len(out.Events), len(w.events), out.Events)
	}
	for i, we := range w.events {
		e := out.Events[i]
		if e.Operation != we.op {
			t.Errorf("event %d: op %v, want %v", i, e.Operation, we.op)
		}
		if got := e.Database + "." + e.Table; got != we.table {
			t.Errorf("event %d: table %q, want %q", i, got, we.table)
		}
		if we.before != "" {
			if got := renderRow(e.Before); got != we.before {
				t.Errorf("event %d: before\n got %s\nwant %s", i, got, we.before)
			}
		}
		if we.after != "" {
			if got := renderRow(e.After); got != we.after {
				t.Errorf("event %d: after\n got %s\nwant %s", i, got, we.after)
			}
		}
		if we.src != (rules.Position{}) && e.Source != we.src {
			t.Errorf("event %d: source %+v, want %+v", i, e.Source, we.src)
		}
	}
}

func TestDecodeDebezium(t *testing.T) {
	kpos := rules.Position{Topic: "dbserver1.inventory.customers", Partition: 3, Offset: 42}
	cases := []struct {
		name  string
		dec   Decoder
		value string
		want  want
	}{
		{
			name:  "update without envelope (payload:4)",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 4),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Update, table: "inventory.customers",
				before: "id=int:1004 first_name=string:Anne last_name=string:Kretchmar email=string:annek@noanswer.org",
				after:  "id=int:1004 first_name=string:Anne Marie last_name=string:Kretchmar email=string:annek@noanswer.org",
				src:    rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "mysql-bin.000003", BinlogPos: 484, TsMs: 1465581029100, ServerID: 223344},
			}}},
		},
		{
			name:  "unknown row fields are kept (payload:3)",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 3),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Update, table: "inventory.customers",
				after: "id=int:1004 first_name=string:Anne last_name=string:Kretchmar middle_name=string:L email=string:annek@noanswer.org",
			}}},
		},
		{
			name:  "delete (payload:5)",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 5),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Delete, table: "inventory.customers",
				before: "id=int:1004 first_name=string:Anne Marie last_name=string:Kretchmar email=string:annek@noanswer.org",
				after:  "nil",
			}}},
		},
		{
			name:  "truncate (payload:6)",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 6),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Truncate, table: "inventory.customers", before: "nil", after: "nil",
			}}},
		},
		{
			name:  "old snapshot c with snapshot \"true\" and envelope (with-schema:1)",
			value: fixtureLine(t, "debezium-mysql-with-schema.ndjson", 1),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Read, table: "inventory.products", before: "nil",
				after: "id=int:101 name=string:scooter description=string:Small 2-wheel scooter weight=float:3.140000104904175",
				// source.ts_ms is 0 in old snapshots: the payload ts_ms is used.
				src: rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "mysql-bin.000003", BinlogPos: 154, TsMs: 1589355606100},
			}}},
		},
		{
			name:  "snapshot c with \"last\"",
			value: strings.Replace(fixtureLine(t, "debezium-mysql-payload.ndjson", 19), `"snapshot":"true"`, `"snapshot":"last"`, 1),
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Read, table: "inventory.products"}}},
		},
		{
			name:  "snapshot c with boolean true",
			value: strings.Replace(fixtureLine(t, "debezium-mysql-payload.ndjson", 11), `"snapshot":"true"`, `"snapshot":true`, 1),
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Read, table: "inventory.products"}}},
		},
		{
			name:  "c with snapshot \"false\" is an insert (payload:22)",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 22),
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Insert, table: "inventory.products", before: "nil"}}},
		},
		{
			name:  "legacy ts_sec and snapshot null (with-schema:20)",
			value: fixtureLine(t, "debezium-mysql-with-schema.ndjson", 20),
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Insert, table: "inventory.customers",
				src: rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "mysql-bin.000003", BinlogPos: 1046, TsMs: 1490635153000, ServerID: 223344},
			}}},
		},
		{
			name:  "postgres connector uses source.schema as database",
			value: fixtureLine(t, "extra-debezium-postgres-payload.ndjson", 1),
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Read, table: "inventory.products"}}},
		},
		{
			name:  "gtid and source position",
			value: `{"op":"u","before":{"id":1},"after":{"id":1},"source":{"db":"d","table":"t","file":"binlog.000007","pos":"99","gtid":"3E11FA47-71CA-11E1-9E33-C80AA9429562:23","ts_ms":1700000000123}}`,
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Update, table: "d.t",
				src: rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "binlog.000007", BinlogPos: 99, GTID: "3E11FA47-71CA-11E1-9E33-C80AA9429562:23", TsMs: 1700000000123},
			}}},
		},
		{
			name:  "server_id 0 (a snapshot row) is unknown",
			value: `{"op":"c","after":{"id":1},"source":{"db":"d","table":"t","file":"binlog.000007","pos":99,"server_id":0}}`,
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Insert, table: "d.t",
				src: rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "binlog.000007", BinlogPos: 99},
			}}},
		},
		{
			name:  "flattened source fields with the server id",
			value: `{"__op":"c","__db":"d","__table":"t","__source_file":"binlog.000008","__source_pos":120,"__source_server_id":7,"__source_gtid":"0-7-31","id":1}`,
			want: want{format: FormatDebeziumFlat, events: []wantEvent{{
				op: rules.Insert, table: "d.t",
				src: rules.Position{Topic: kpos.Topic, Partition: 3, Offset: 42, BinlogFile: "binlog.000008", BinlogPos: 120, GTID: "0-7-31", ServerID: 7},
			}}},
		},
		{
			name:  "without source the table map names the table (payload:9)",
			dec:   Decoder{TopicTables: map[string]string{kpos.Topic: "inventory.full_types"}},
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 9),
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Read, table: "inventory.full_types"}}},
		},
		{
			name:  "without source or table map",
			value: fixtureLine(t, "debezium-mysql-payload.ndjson", 9),
			want:  want{errHas: []string{"missing table name", kpos.Topic}},
		},
		{
			name:  "exact big integers, floats, bools, nested JSON",
			value: `{"op":"c","after":{"a":9223372036854775808,"b":18446744073709551615,"c":-9223372036854775809,"d":1.0,"e":1e3,"f":-0.5E-7,"g":true,"h":false,"i":null,"j":{"x":1.0, "y":[1,"2"]},"k":[],"l":0},"source":{"db":"d","table":"t"}}`,
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Insert, table: "d.t",
				after: `a=int:9223372036854775808 b=int:18446744073709551615 c=int:-9223372036854775809 d=float:1.0 e=float:1e3 f=float:-0.5E-7 g=bool:1 h=bool:0 i=null: j=json:{"x":1.0, "y":[1,"2"]} k=json:[] l=int:0`,
			}}},
		},
		{
			name:  "string escapes and surrogates",
			value: `{"op":"c","after":{"s":"q\"b\\s\/n\n t\t \u00e9 \ud83d\ude00 \ud800x \b\f\r","k\u0065y":"plain","j":"{\"key1\": \"value1\"}"},"source":{"db":"d","table":"t"}}`,
			want: want{format: FormatDebezium, events: []wantEvent{{
				op: rules.Insert, table: "d.t",
				after: "s=string:q\"b\\s/n\n t\t é 😀 \ufffdx \b\f\r key=string:plain j=string:{\"key1\": \"value1\"}",
			}}},
		},
		{
			name:  "pretty-printed",
			value: "\n {\n \"op\" : \"d\" ,\n \"before\" : { \"id\" : 7 } ,\n \"after\" : null ,\n \"source\" : { \"db\" : \"d\" , \"table\" : \"t\" }\n }\n",
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Delete, table: "d.t", before: "id=int:7", after: "nil"}}},
		},
		{
			name:  "empty row image is present",
			value: `{"op":"c","after":{},"source":{"db":"d","table":"t"}}`,
			want:  want{format: FormatDebezium, events: []wantEvent{{op: rules.Insert, table: "d.t", before: "nil", after: ""}}},
		},
		{name: "nil value is a tombstone", value: "<nil>", want: want{format: FormatAuto, skip: SkipTombstone}},
		{name: "empty value is a tombstone", value: "", want: want{format: FormatAuto, skip: SkipTombstone}},
		{name: "JSON null is a tombstone", value: " null\n", want: want{format: FormatAuto, skip: SkipTombstone}},
		{name: "envelope with null payload", value: `{"schema":null,"payload":null}`, want: want{format: FormatAuto, skip: SkipTombstone}},
		{name: "transaction BEGIN", value: fixtureLine(t, "debezium-mysql-transaction.ndjson", 1), want: want{format: FormatDebezium, skip: SkipTransaction}},
		{name: "transaction END", value: fixtureLine(t, "debezium-mysql-transaction.ndjson", 2), want: want{format: FormatDebezium, skip: SkipTransaction}},
		{name: "schema change in envelope", value: fixtureLine(t, "debezium-mysql-schema-change.ndjson", 1), want: want{format: FormatDebezium, skip: SkipSchemaChange}},
		{name: "heartbeat", value: `{"ts_ms":1700000000000}`, want: want{format: FormatDebezium, skip: SkipHeartbeat}},
		{
			name:  "heartbeat in envelope, fixed format",
			dec:   Decoder{Format: FormatDebezium},
			value: `{"schema":{"type":"struct","name":"io.debezium.connector.common.Heartbeat"},"payload":{"ts_ms":1}}`,
			want:  want{format: FormatDebezium, skip: SkipHeartbeat},
		},
		{name: "logical decoding message", value: `{"op":"m","source":{"db":"d","table":"t"}}`, want: want{format: FormatDebezium, skip: SkipMessage}},
		{name: "unknown op", value: `{"op":"x","after":{"id":1},"source":{"db":"d","table":"t"}}`, want: want{errHas: []string{"op: at byte 6", `unknown operation type "x"`, "cannot be planned"}}},
		{name: "create without after", value: `{"op":"c","before":null,"after":null,"source":{"db":"d","table":"t"}}`, want: want{errHas: []string{"after", "op c without an after image"}}},
		{name: "delete without before", value: `{"op":"d","before":null,"source":{"db":"d","table":"t"}}`, want: want{errHas: []string{"op d without a before image"}}},
		{name: "before is a string", value: `{"op":"u","before":"x","after":{},"source":{"db":"d","table":"t"}}`, want: want{errHas: []string{"before", "not an object"}}},
		{name: "op not a string", value: `{"op":1,"after":{},"source":{"db":"d","table":"t"}}`, want: want{errHas: []string{"op is not a string"}}},
		{
			name:  "fixed debezium format rejects a Maxwell message",
			dec:   Decoder{Format: FormatDebezium},
			value: fixtureLine(t, "maxwell.ndjson", 1),
			want:  want{errHas: []string{`no "op" member`}},
		},
		{name: "envelope payload not an object", value: `{"schema":{},"payload":"x"}`, want: want{errHas: []string{"payload", "not an object"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkDecode(t, &tc.dec, tc.value, kpos, tc.want)
		})
	}
}

// decimalEnvelope builds an envelope whose schema declares column c of
// the after struct as a Connect Decimal of the given scale.
func decimalEnvelope(scale, value string) string {
	return `{"schema":{"type":"struct","fields":[{"type":"struct","fields":[{"type":"int32","field":"id"},` +
		`{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"` + scale + `","connect.decimal.precision":"20"},"field":"c"}],"optional":true,"name":"x.Value","field":"after"},` +
		`{"type":"struct","fields":[{"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"9"},"field":"c"}],"name":"x.Other","field":"other"}],"name":"x.Envelope"},` +
		`"payload":{"op":"c","before":null,"after":{"id":1,"c":` + value + `},"source":{"db":"d","table":"t"}}}`
}

func TestDecodeDebeziumDecimal(t *testing.T) {
	cases := []struct {
		scale, value, want string
		errHas             string
	}{
		{"4", `"EtaH"`, "c=float:123.4567", ""},
		{"0", `"AVo="`, "c=int:346", ""},
		{"1", `"FJqkSQ=="`, "c=float:34567892.1", ""},
		{"0", `"AP//////////"`, "c=int:18446744073709551615", ""},
		{"0", `"gAAAAAAAAAAA"`, "c=int:-2361183241434822606848", ""},
		{"2", `"/w=="`, "c=float:-0.01", ""},
		{"3", `"BQ=="`, "c=float:0.005", ""},
		{"-2", `"BQ=="`, "c=int:500", ""},
		{"2", `12.5`, "c=float:12.5", ""}, // decimal.format=numeric: already a number
		{"2", `null`, "c=null:", ""},
		{"2", `"not base64!"`, "", "payload.c: decimal value is not base64"},
	}
	var d Decoder
	for _, tc := range cases {
		t.Run(tc.scale+"/"+tc.value, func(t *testing.T) {
			w := want{format: FormatDebezium, events: []wantEvent{{op: rules.Insert, table: "d.t", after: "id=int:1 " + tc.want}}}
			if tc.errHas != "" {
				w = want{errHas: []string{tc.errHas}}
			}
			checkDecode(t, &d, decimalEnvelope(tc.scale, tc.value), rules.Position{}, w)
		})
	}

	t.Run("variable scale", func(t *testing.T) {
		v := `{"schema":{"type":"struct","fields":[{"type":"struct","fields":[{"type":"struct","name":"io.debezium.data.VariableScaleDecimal","fields":[{"type":"int32","field":"scale"},{"type":"bytes","field":"value"}],"field":"v"}],"field":"before"}]},` +
			`"payload":{"op":"d","before":{"v":{"scale":2,"value":"BNI="}},"source":{"db":"d","table":"t"}}}`
		checkDecode(t, &d, v, rules.Position{}, want{format: FormatDebezium, events: []wantEvent{{op: rules.Delete, table: "d.t", before: "v=float:12.34"}}})
	})

	t.Run("flattened row schema", func(t *testing.T) {
		v := `{"schema":{"type":"struct","fields":[{"type":"int32","field":"id"},{"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2"},"field":"price"}]},` +
			`"payload":{"id":1,"price":"MDk=","__op":"c","__db":"d","__table":"t"}}`
		checkDecode(t, &d, v, rules.Position{}, want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Insert, table: "d.t", after: "id=int:1 price=float:123.45"}}})
	})
}

func TestDecodeDebeziumFlat(t *testing.T) {
	pos := rules.Position{Topic: "cdc.customers", Offset: 9}
	mapped := Decoder{TopicTables: map[string]string{"cdc.customers": "inventory.customers"}}
	cases := []struct {
		name  string
		dec   Decoder
		value string
		want  want
	}{
		{
			name:  "read with __db/__table, metadata stripped (unwrap:1)",
			value: fixtureLine(t, "debezium-unwrap.ndjson", 1),
			want: want{format: FormatDebeziumFlat, events: []wantEvent{{
				op: rules.Read, table: "inventory.customers", before: "nil",
				after: "id=int:1001 first_name=string:Sally last_name=string:Thomas email=string:sally.thomas@acme.com",
			}}},
		},
		{
			name:  "insert, table from topic map, __ts_ms (unwrap:14)",
			dec:   mapped,
			value: fixtureLine(t, "debezium-unwrap.ndjson", 14),
			want: want{format: FormatDebeziumFlat, events: []wantEvent{{
				op: rules.Insert, table: "inventory.customers",
				src: rules.Position{Topic: "cdc.customers", Offset: 9, TsMs: 1588927306269},
			}}},
		},
		{
			name:  "update has no before image (unwrap:15)",
			dec:   mapped,
			value: fixtureLine(t, "debezium-unwrap.ndjson", 15),
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Update, table: "inventory.customers", before: "nil"}}},
		},
		{
			name:  "__op d: delete whose before image is the row (unwrap:16)",
			dec:   mapped,
			value: fixtureLine(t, "debezium-unwrap.ndjson", 16),
			want: want{format: FormatDebeziumFlat, events: []wantEvent{{
				op: rules.Delete, table: "inventory.customers",
				before: "id=int:1002 first_name=string:George last_name=string:Bailey email=string:gbailey@foobar.com", after: "nil",
			}}},
		},
		{
			name:  "__deleted \"true\" alone (unwrap:18), default table",
			dec:   Decoder{Table: "shop.items"},
			value: fixtureLine(t, "debezium-unwrap.ndjson", 18),
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Delete, table: "shop.items", before: "pk=int:2 cola=null:", after: "nil"}}},
		},
		{
			name:  "__deleted boolean true",
			dec:   mapped,
			value: `{"id":5,"__deleted":true}`,
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Delete, table: "inventory.customers", before: "id=int:5"}}},
		},
		{
			name:  "__deleted false with __op u",
			dec:   mapped,
			value: `{"id":5,"__op":"u","__deleted":false}`,
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Update, table: "inventory.customers", after: "id=int:5"}}},
		},
		{
			name:  "__table without __db takes the database from the map (unwrap:19)",
			dec:   Decoder{Table: "inventory.other"},
			value: fixtureLine(t, "debezium-unwrap.ndjson", 19),
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Insert, table: "inventory.MY_TABLE", after: "", src: rules.Position{Topic: "cdc.customers", Offset: 9, TsMs: 123456789}}}},
		},
		{
			name:  "no __ fields: auto cannot tell (unwrap:17)",
			dec:   mapped,
			value: fixtureLine(t, "debezium-unwrap.ndjson", 17),
			want:  want{errHas: []string{"unrecognised change-event format", "field1 field2"}},
		},
		{
			name:  "no __ fields with format debezium-flat: an upsert",
			dec:   Decoder{Format: FormatDebeziumFlat, Table: "d.t"},
			value: fixtureLine(t, "debezium-unwrap.ndjson", 17),
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Update, table: "d.t", before: "nil", after: "field1=string:newvalue1 field2=string:newvalue2"}}},
		},
		{
			name:  "debezium-flat: columns named like envelope keys are columns",
			dec:   Decoder{Format: FormatDebeziumFlat, Table: "d.t"},
			value: `{"op":"x","type":"SHIPPING","data":[1],"source":{"a":1}}`,
			want:  want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Update, table: "d.t", after: `op=string:x type=string:SHIPPING data=json:[1] source=json:{"a":1}`}}},
		},
		{
			name:  "no table anywhere",
			value: fixtureLine(t, "debezium-unwrap.ndjson", 18),
			want:  want{errHas: []string{"missing table name"}},
		},
		{name: "bad __deleted", dec: mapped, value: `{"id":1,"__deleted":"maybe"}`, want: want{errHas: []string{"__deleted"}}},
		{name: "unknown __op", dec: mapped, value: `{"id":1,"__op":"z"}`, want: want{errHas: []string{"__op", `unknown operation type "z"`}}},
		{name: "unknown __op of a deleted row", dec: mapped, value: `{"id":1,"__op":"z","__deleted":"true"}`, want: want{format: FormatDebeziumFlat, events: []wantEvent{{op: rules.Delete, table: "inventory.customers"}}}},
		{name: "tombstone", dec: Decoder{Format: FormatDebeziumFlat}, value: "", want: want{format: FormatDebeziumFlat, skip: SkipTombstone}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkDecode(t, &tc.dec, tc.value, pos, tc.want)
		})
	}
}

func TestDecodeMaxwell(t *testing.T) {
	pos := rules.Position{Topic: "maxwell", Partition: 1, Offset: 5}
	cases := []struct {
		name  string
		dec   Decoder
		value string
		want  want
	}{
		{
			name:  "insert, ts in seconds (maxwell:1)",
			value: fixtureLine(t, "maxwell.ndjson", 1),
			want: want{format: FormatMaxwell, events: []wantEvent{{
				op: rules.Insert, table: "test.product", before: "nil",
				after: "id=int:101 name=string:scooter description=string:Small 2-wheel scooter weight=float:3.14",
				src:   rules.Position{Topic: "maxwell", Partition: 1, Offset: 5, TsMs: 1596684883000},
			}}},
		},
		{
			name:  "update: before = data overlaid with old (maxwell:14)",
			value: fixtureLine(t, "maxwell.ndjson", 14),
			want: want{format: FormatMaxwell, events: []wantEvent{{
				op: rules.Update, table: "test.product",
				before: "id=int:110 name=string:jacket description=string:water resistent white wind breaker weight=float:0.2",
				after:  "id=int:110 name=string:jacket description=string:new water resistent white wind breaker weight=float:0.5",
			}}},
		},
		{
			name:  "update with old keys absent from data (maxwell:38)",
			value: fixtureLine(t, "maxwell.ndjson", 38),
			want: want{format: FormatMaxwell, events: []wantEvent{{
				op: rules.Update, table: "MyDatabase.User",
				before: "UserID=int:20 FirstName=string:Foo MiddleName=null: LastName=string:Bar Version=int:1486703131000 backup_date=string:2017-02-08 02:00:05 DoubleField=float:4500000001.512456777",
				after:  "UserID=int:20 FirstName=string:Fiz MiddleName=null: LastName=string:Buz Version=int:1486703131000",
			}}},
		},
		{
			name:  "delete (maxwell:16)",
			value: fixtureLine(t, "maxwell.ndjson", 16),
			want:  want{format: FormatMaxwell, events: []wantEvent{{op: rules.Delete, table: "test.product", after: "nil", before: "id=int:111 name=string:scooter description=string:Big 2-wheel scooter  weight=float:5.17"}}},
		},
		{
			name:  "binlog position (maxwell:21)",
			value: fixtureLine(t, "maxwell.ndjson", 21),
			want: want{format: FormatMaxwell, events: []wantEvent{{
				op: rules.Insert, table: "test.e",
				src: rules.Position{Topic: "maxwell", Partition: 1, Offset: 5, BinlogFile: "master.000006", BinlogPos: 800911, TsMs: 1477053217000, ServerID: 23042},
			}}},
		},
		{
			name:  "SET column is JSON (maxwell:27), database from default table",
			dec:   Decoder{Table: "test.test_sets"},
			value: fixtureLine(t, "maxwell.ndjson", 27),
			want:  want{format: FormatMaxwell, events: []wantEvent{{op: rules.Insert, table: "test.test_sets", after: `setcol=json:["b_val","c_val"]`}}},
		},
		{
			name:  "no database and no default",
			value: fixtureLine(t, "maxwell.ndjson", 26),
			want:  want{errHas: []string{"missing database name"}},
		},
		{
			name:  "bootstrap-insert is a read (maxwell:31)",
			value: fixtureLine(t, "maxwell.ndjson", 31),
			want:  want{format: FormatMaxwell, events: []wantEvent{{op: rules.Read, table: "fooDB.barTable", after: "txt=string:hello"}}},
		},
		{
			name:  "gtid and millisecond ts",
			value: `{"database":"d","table":"t","type":"insert","ts":1700000000123,"gtid":"uuid:5","data":{"id":1}}`,
			want:  want{format: FormatMaxwell, events: []wantEvent{{op: rules.Insert, table: "d.t", src: rules.Position{Topic: "maxwell", Partition: 1, Offset: 5, GTID: "uuid:5", TsMs: 1700000000123}}}},
		},
		{name: "bootstrap-start", value: fixtureLine(t, "maxwell.ndjson", 30), want: want{format: FormatMaxwell, skip: SkipBootstrap}},
		{name: "bootstrap-complete", value: fixtureLine(t, "maxwell.ndjson", 33), want: want{format: FormatMaxwell, skip: SkipBootstrap}},
		{name: "table-create", value: fixtureLine(t, "maxwell.ndjson", 24), want: want{format: FormatMaxwell, skip: SkipDDL}},
		{name: "table-alter", value: fixtureLine(t, "maxwell.ndjson", 25), want: want{format: FormatMaxwell, skip: SkipDDL}},
		{name: "heartbeat", value: `{"database":"d","table":"t","type":"heartbeat","ts":1}`, want: want{format: FormatMaxwell, skip: SkipHeartbeat}},
		{name: "unknown type", value: `{"database":"d","table":"t","type":"upsert","ts":1,"data":{"id":1}}`, want: want{errHas: []string{"type: at byte", `unknown operation type "upsert"`}}},
		{name: "encrypt=data", value: fixtureLine(t, "maxwell.ndjson", 35), want: want{errHas: []string{"encrypted"}}},
		{name: "encrypt=all", value: fixtureLine(t, "maxwell.ndjson", 36), want: want{errHas: []string{"encrypted"}}},
		{name: "insert without data", value: `{"database":"d","table":"t","type":"insert"}`, want: want{errHas: []string{"data", "insert without data"}}},
		{name: "data not an object", value: `{"database":"d","table":"t","type":"insert","data":"x"}`, want: want{errHas: []string{"data is not an object"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkDecode(t, &tc.dec, tc.value, pos, tc.want)
		})
	}
}

func TestDecodeCanal(t *testing.T) {
	pos := rules.Position{Topic: "canal", Offset: 77}
	cases := []struct {
		name  string
		dec   Decoder
		value string
		want  want
	}{
		{
			name:  "multi-row update with old, typed by mysqlType (canal:23)",
			value: fixtureLine(t, "canal-flat.ndjson", 23),
			want: want{format: FormatCanal, events: []wantEvent{
				{
					op: rules.Update, table: "mydb.product",
					before: "id=int:101 name=string:scooter description=string:Small 2-wheel scooter weight=float:3.14",
					after:  "id=int:101 name=string:scooter description=string:Small 2-wheel scooter weight=float:5.17",
					src:    rules.Position{Topic: "canal", Offset: 77, TsMs: 1598944337000},
				},
				{
					op: rules.Update, table: "mydb.product",
					before: "id=int:102 name=string:car battery description=string:12V car battery weight=float:8.1",
					after:  "id=int:102 name=string:car battery description=string:12V car battery weight=float:5.17",
				},
			}},
		},
		{
			name:  "old sets a column to NULL (canal:13)",
			value: fixtureLine(t, "canal-flat.ndjson", 13),
			want: want{format: FormatCanal, events: []wantEvent{{
				op: rules.Update, table: "mydb.product",
				before: "id=int:106 name=string:hammer description=null: weight=float:1.0",
			}}},
		},
		{
			name:  "multi-row delete (canal:25)",
			value: fixtureLine(t, "canal-flat.ndjson", 25),
			want: want{format: FormatCanal, events: []wantEvent{
				{op: rules.Delete, table: "mydb.product", after: "nil", before: "id=int:102 name=string:car battery description=string:12V car battery weight=float:5.17"},
				{op: rules.Delete, table: "mydb.product", after: "nil", before: "id=int:103 name=string:12-pack drill bits description=string:12-pack of drill bits with sizes ranging from #40 to #3 weight=float:0.8"},
			}},
		},
		{
			name:  "date stays a string, INTEGER type name (canal:15)",
			value: fixtureLine(t, "canal-flat.ndjson", 15),
			want: want{format: FormatCanal, events: []wantEvent{
				{op: rules.Insert, table: "mydb.orders", after: "order_number=int:10001 order_date=string:2016-01-16 purchaser=int:1001 quantity=int:1 product_id=int:102"},
				{op: rules.Insert, table: "mydb.orders"}, {op: rules.Insert, table: "mydb.orders"}, {op: rules.Insert, table: "mydb.orders"},
			}},
		},
		{
			name:  "INIT is a read; column absent from mysqlType stays a string (canal:29 as INIT)",
			value: strings.Replace(fixtureLine(t, "canal-flat.ndjson", 29), `"type":"UPDATE"`, `"type":"INIT"`, 1),
			want: want{format: FormatCanal, events: []wantEvent{{
				op: rules.Read, table: "inventory.products2", before: "nil",
				after: "id=int:106 name=string:hammer description=string:18oz carpenter hammer weight=float:1.0 other=string:val0",
			}}},
		},
		{
			name:  "Flink canal-json: typed JSON numbers, full old row",
			value: fixtureLine(t, "extra-flinkcdc-emulated-canal.ndjson", 5),
			dec:   Decoder{Table: "inventory.unused"},
			want: want{format: FormatCanal, events: []wantEvent{{
				op: rules.Insert, table: "$databaseName.products",
				after: "id=int:107 name=string:rocks description=string:box of assorted rocks weight=float:5.3 enum_c=null: json_c=null: point_c=null:",
			}}},
		},
		{
			name: "mysqlType variants",
			value: `{"data":[{"a":"18446744073709551615","b":"-12","c":"12.50","d":"1","e":"x1","f":"1e5","g":"abc","h":"0.5","i":"2021"}],"database":"d","table":"t","isDdl":false,` +
				`"mysqlType":{"a":"bigint(20) unsigned","b":"int(11)","c":"decimal(10,2)","d":"bit(1)","e":"int","f":"double","g":"varchar(3)","h":"FLOAT","i":"year(4)"},"old":null,"type":"INSERT"}`,
			want: want{format: FormatCanal, events: []wantEvent{{
				op: rules.Insert, table: "d.t",
				after: "a=int:18446744073709551615 b=int:-12 c=float:12.50 d=int:1 e=string:x1 f=float:1e5 g=string:abc h=float:0.5 i=int:2021",
			}}},
		},
		{
			name:  "sqlType when mysqlType is absent",
			value: `{"data":[{"a":"5","b":"2.5","c":"x"}],"database":"d","table":"t","isDdl":false,"sqlType":{"a":-5,"b":3,"c":12},"type":"INSERT"}`,
			want:  want{format: FormatCanal, events: []wantEvent{{op: rules.Insert, table: "d.t", after: "a=int:5 b=float:2.5 c=string:x"}}},
		},
		{
			name:  "old shorter than data",
			value: `{"data":[{"id":"1","v":"a"},{"id":"2","v":"b"}],"database":"d","table":"t","isDdl":false,"mysqlType":{"id":"int"},"old":[{"v":"z"}],"type":"UPDATE"}`,
			want: want{format: FormatCanal, events: []wantEvent{
				{op: rules.Update, table: "d.t", before: "id=int:1 v=string:z", after: "id=int:1 v=string:a"},
				{op: rules.Update, table: "d.t", before: "id=int:2 v=string:b", after: "id=int:2 v=string:b"},
			}},
		},
		{
			name:  "TRUNCATE DDL is a truncate",
			value: `{"data":null,"database":"d","es":1,"id":1,"isDdl":true,"mysqlType":null,"old":null,"pkNames":null,"sql":"truncate table t","sqlType":null,"table":"t","ts":2,"type":"TRUNCATE"}`,
			want:  want{format: FormatCanal, events: []wantEvent{{op: rules.Truncate, table: "d.t", before: "nil", after: "nil"}}},
		},
		{name: "CREATE DDL (canal:14)", value: fixtureLine(t, "canal-flat.ndjson", 14), want: want{format: FormatCanal, skip: SkipDDL}},
		{name: "empty data", value: `{"data":[],"database":"d","table":"t","isDdl":false,"type":"INSERT"}`, want: want{format: FormatCanal, skip: SkipEmpty}},
		{name: "QUERY", value: `{"data":null,"database":"d","table":"t","isDdl":false,"type":"QUERY"}`, want: want{format: FormatCanal, skip: SkipQuery}},
		{name: "MHEARTBEAT", value: `{"data":null,"database":"d","table":"t","isDdl":false,"type":"MHEARTBEAT"}`, want: want{format: FormatCanal, skip: SkipHeartbeat}},
		{name: "unknown type", value: `{"data":[{"id":"1"}],"database":"d","table":"t","isDdl":false,"type":"REPLACE"}`, want: want{errHas: []string{"type: at byte", `unknown operation type "REPLACE"`}}},
		{name: "DML without data", value: `{"data":null,"database":"d","table":"t","isDdl":false,"type":"INSERT"}`, want: want{errHas: []string{"INSERT without data"}}},
		{name: "data element not an object", value: `{"data":[{"a":"1"},2],"database":"d","table":"t","isDdl":false,"type":"INSERT"}`, want: want{errHas: []string{"data is not an array of objects"}}},
		{name: "old not rows", value: `{"data":[{"a":"1"}],"old":{"a":"2"},"database":"d","table":"t","isDdl":false,"type":"UPDATE"}`, want: want{errHas: []string{"old is not an array"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkDecode(t, &tc.dec, tc.value, pos, tc.want)
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	deep := `{"op":"c","after":{"x":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `},"source":{"db":"d","table":"t"}}`
	cases := []struct {
		name   string
		value  string
		errHas []string
		offset int // expected DecodeError.Offset; -2 = don't check
		path   string
	}{
		{"not an object", `[1,2]`, []string{"not a JSON object"}, 0, ""},
		{"bare string", ` "x"`, []string{"not a JSON object"}, 1, ""},
		{"truncated", `{"op":"c","after":{"id":1`, []string{"unexpected end of input"}, 25, "after"},
		{"trailing garbage", `{"op":"c","after":{},"source":{"db":"d","table":"t"}} x`, []string{"unexpected data after the JSON object"}, 54, ""},
		{"two objects", `{"ts_ms":1}{"ts_ms":2}`, []string{"unexpected data after"}, 11, ""},
		{"bad number", `{"op":"c","after":{"id":01},"source":{}}`, []string{"expected ',' or '}'"}, 25, "after"},
		{"bad number sign", `{"op":"c","after":{"id":-},"source":{}}`, []string{"invalid number"}, 24, "after.id"},
		{"bad fraction", `{"op":"c","after":{"id":1.},"source":{}}`, []string{"no digits after '.'"}, 24, "after.id"},
		{"bad literal", `{"op":"c","after":{"id":tru},"source":{}}`, []string{"expected a JSON value"}, 24, "after.id"},
		{"unquoted key", `{op:"c"}`, []string{"expected member name"}, 1, ""},
		{"missing colon", `{"op" "c"}`, []string{"expected ':'"}, 6, ""},
		{"trailing comma", `{"op":"c",}`, []string{"expected member name"}, 10, ""},
		{"control char in string", "{\"op\":\"c\x01\"}", []string{"control character"}, 8, "op"},
		{"bad escape", `{"op":"\x"}`, []string{"invalid escape"}, 7, "op"},
		{"bad unicode escape", `{"op":"\u12G4"}`, []string{`invalid \u escape`}, 7, "op"},
		{"unterminated string", `{"op":"c`, []string{"unterminated string"}, 6, "op"},
		{"error inside array element", `{"data":[{"a":"1"},{"a":x}],"type":"INSERT","isDdl":false}`, []string{"data[1].a"}, 24, "data[1].a"},
		{"error inside envelope", `{"schema":{},"payload":{"op":"c","after":{"id":x}}}`, []string{"payload.after.id: at byte 47"}, 47, "payload.after.id"},
		{"escaped key in path", `{"op":"c","after":{"i\u0064":x}}`, []string{"after.id"}, 29, "after.id"},
		// Members of source that are only validated name no path below it.
		{"bad literal in skipped source member", `{"op":"c","after":{},"source":{"version":tru,"db":"d","table":"t"}}`, []string{"expected a JSON value"}, 41, "source"},
		{"bad number in skipped source member", `{"op":"c","after":{},"source":{"row":1.,"db":"d","table":"t"}}`, []string{"no digits after '.'"}, 37, "source"},
		{"bad escape deep in skipped source member", `{"op":"c","after":{},"source":{"db":"d","table":"t","x":{"a":"\q"}}}`, []string{"invalid escape 'q'"}, 62, "source"},
		{"bad number in read source member", `{"op":"c","after":{},"source":{"db":"d","pos":-,"table":"t"}}`, []string{"invalid number: no digits"}, 46, "source.pos"},
		{"missing comma in source", `{"op":"c","after":{},"source":{"db":"d" "table":"t"}}`, []string{"expected ',' or '}'"}, 40, "source"},
		{"too deep", deep, []string{"nesting deeper than 64"}, -2, "after.x"},
		{"unknown shape", `{"hello":"world"}`, []string{"unrecognised change-event format", "hello"}, -1, ""},
	}
	var d Decoder
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out Decoded
			err := d.Decode([]byte(tc.value), rules.Position{}, &out)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want *DecodeError", err)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if tc.offset != -2 && de.Offset != tc.offset {
				t.Errorf("offset = %d, want %d (%v)", de.Offset, tc.offset, err)
			}
			if de.Path != tc.path {
				t.Errorf("path = %q, want %q", de.Path, tc.path)
			}
		})
	}
}

// TestDecodeReuse checks that a Decoded reused across messages yields the
// same events as a fresh one and that strings of earlier events survive.
func TestDecodeReuse(t *testing.T) {
	var d Decoder
	var reused Decoded
	var keep []string
	for _, file := range []string{"canal-flat.ndjson", "maxwell.ndjson", "debezium-mysql-payload.ndjson", "debezium-unwrap.ndjson"} {
		for n, line := range fixtureLines(t, file) {
			var fresh Decoded
			errFresh := d.Decode([]byte(line), rules.Position{Line: n + 1}, &fresh)
			errReused := d.Decode([]byte(line), rules.Position{Line: n + 1}, &reused)
			if (errFresh == nil) != (errReused == nil) || renderEvents(&fresh) != renderEvents(&reused) {
				t.Fatalf("%s:%d: reused Decoded differs:\n%s\n%s", file, n+1, renderEvents(&fresh), renderEvents(&reused))
			}
			for _, e := range reused.Events {
				if len(e.After) > 0 {
					keep = append(keep, e.After[0].Value.Text)
				}
			}
		}
	}
	if len(keep) == 0 || keep[0] != "101" {
		t.Fatalf("first kept value = %q, want the first Canal row's id 101", keep)
	}
}

func renderEvents(out *Decoded) string {
	var b strings.Builder
	fmt.Fprintf(&b, "format=%v skip=%q\n", out.Format, out.Skip)
	for _, e := range out.Events {
		s := e.Source
		fmt.Fprintf(&b, "  %s %s.%s file=%q pos=%d gtid=%q ts_ms=%d topic=%q partition=%d offset=%d line=%d\n",
			e.Operation, e.Database, e.Table, s.BinlogFile, s.BinlogPos, s.GTID, s.TsMs, s.Topic, s.Partition, s.Offset, s.Line)
		fmt.Fprintf(&b, "    before: %s\n    after:  %s\n", renderRowQuoted(e.Before), renderRowQuoted(e.After))
	}
	return b.String()
}

func renderRowQuoted(r rules.Row) string {
	if r == nil {
		return "nil"
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, c := range r {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%s:%q", c.Name, c.Value.Kind, c.Value.Text)
	}
	b.WriteByte('}')
	return b.String()
}

// TestDecodeGolden decodes every line of every fixture file with format
// detection and compares the result with testdata/decode/<file>.golden.
// Run with -update to rewrite the golden files, then review the diff.
func TestDecodeGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "decode", "*.ndjson"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	var d Decoder
	var out Decoded
	for _, path := range files {
		name := filepath.Base(path)
		var b strings.Builder
		for n, line := range fixtureLines(t, name) {
			err := d.Decode([]byte(line), rules.Position{Topic: "topic", Partition: 1, Offset: int64(n), Line: n + 1}, &out)
			fmt.Fprintf(&b, "%s:%d ", name, n+1)
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
				continue
			}
			b.WriteString(renderEvents(&out))
		}
		golden := strings.TrimSuffix(path, ".ndjson") + ".golden"
		if *updateGolden {
			if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		wantText, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test -run TestDecodeGolden -update)", err)
		}
		if got := b.String(); got != string(wantText) {
			t.Errorf("%s: output differs from %s:\n%s", name, golden, firstDiff(got, string(wantText)))
		}
	}
}

func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n got: %s\nwant: %s", i+1, gl, wl)
		}
	}
	return ""
}

// TestDecodeAllocs pins the steady-state allocation count of decoding a
// message without escaped strings: none, as strings are read in place and
// the source position's copies are reused while they do not change.
func TestDecodeAllocs(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		dec         Decoder
	}{
		{"debezium", fixtureLine(t, "debezium-mysql-payload.ndjson", 4), Decoder{}},
		{"maxwell", fixtureLine(t, "maxwell.ndjson", 14), Decoder{}},
		{"canal", fixtureLine(t, "canal-flat.ndjson", 23), Decoder{}},
		{"debezium-flat", fixtureLine(t, "debezium-unwrap.ndjson", 1), Decoder{Format: FormatDebeziumFlat}},
	} {
		var out Decoded
		in := []byte(tc.value)
		if err := tc.dec.Decode(in, rules.Position{}, &out); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(50, func() {
			if err := tc.dec.Decode(in, rules.Position{}, &out); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 0 {
			t.Errorf("%s: %.1f allocations per Decode, want none", tc.name, allocs)
		}
	}
}

// TestDecodeSourceOutlivesValue checks what Decode promises to keep valid
// after the message value changes: the binlog file and GTID of every
// event's source position, and the text of errors. (Column values may
// share the value's memory.)
func TestDecodeSourceOutlivesValue(t *testing.T) {
	cases := []struct {
		name, value string
		dec         Decoder
		file, gtid  string
		errPath     string
	}{
		{"debezium", `{"op":"c","after":{"id":1},"source":{"db":"d","table":"t","file":"bin.000007","pos":4,"gtid":"uuid:12"}}`, Decoder{}, "bin.000007", "uuid:12", ""},
		{"debezium-flat", `{"__op":"c","__db":"d","__table":"t","__source_file":"bin.000008","__source_gtid":"uuid:13","id":1}`, Decoder{}, "bin.000008", "uuid:13", ""},
		{"maxwell", `{"database":"d","table":"t","type":"insert","data":{"id":1},"position":"bin.000009:4","gtid":"uuid:14"}`, Decoder{}, "bin.000009", "uuid:14", ""},
		{"canal", `{"database":"d","table":"t","type":"INSERT","isDdl":false,"data":[{"id":"1"},{"id":"2"}],"gtid":"uuid:15"}`, Decoder{}, "", "uuid:15", ""},
		{"error path from a key", `{"__op":1,"__db":"d","__table":"t"}`, Decoder{}, "", "", "__op"},
		{"error path from another key", `{"__deleted":"maybe","__db":"d","__table":"t"}`, Decoder{}, "", "", "__deleted"},
		{"error path of a decimal column", decimalEnvelope("2", `"not base64"`), Decoder{}, "", "", "payload.c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			value := []byte(tc.value)
			var out Decoded
			err := tc.dec.Decode(value, rules.Position{}, &out)
			var msg string
			if err != nil {
				msg = err.Error()
			} else if len(out.Events) == 0 {
				t.Fatalf("no events (skip %q)", out.Skip)
			}
			for i := range value {
				value[i] = '#'
			}
			if err != nil {
				if got := err.Error(); got != msg || strings.Contains(got, "#") {
					t.Fatalf("error changed with the value: %q, was %q", got, msg)
				}
				var de *DecodeError
				if errors.As(err, &de) && tc.errPath != "" && de.Path != tc.errPath {
					t.Fatalf("error path = %q, want %q", de.Path, tc.errPath)
				}
				return
			}
			for _, e := range out.Events {
				if e.Source.BinlogFile != tc.file || e.Source.GTID != tc.gtid {
					t.Errorf("source after the value changed: file %q gtid %q, want %q %q", e.Source.BinlogFile, e.Source.GTID, tc.file, tc.gtid)
				}
			}
		})
	}
}

// TestParseInt64 checks the integer reading of positions and timestamps
// against strconv.ParseInt, which it must agree with.
func TestParseInt64(t *testing.T) {
	for _, text := range []string{
		"0", "7", "0017", "123456789012345678", "999999999999999999", "1000000000000000000",
		"9223372036854775807", "9223372036854775808", "-5", "+5", "", "-", "1x", " 1", "1.0",
	} {
		wantN, err := strconv.ParseInt(text, 10, 64)
		for _, kind := range []rules.Kind{rules.KindInt, rules.KindString} {
			n, ok := parseInt64(rules.Value{Kind: kind, Text: text})
			if ok != (err == nil) || (ok && n != wantN) {
				t.Errorf("parseInt64(%v %q) = %d, %v; strconv says %d, %v", kind, text, n, ok, wantN, err)
			}
		}
	}
	if _, ok := parseInt64(rules.Value{Kind: rules.KindFloat, Text: "1"}); ok {
		t.Error("parseInt64 read a float")
	}
}

// TestDecodeConcurrent decodes with one Decoder from several goroutines,
// each with its own Decoded (run with -race).
func TestDecodeConcurrent(t *testing.T) {
	d := Decoder{TopicTables: map[string]string{"t": "d.t"}}
	lines := fixtureLines(t, "debezium-mysql-payload.ndjson")
	want := make([]string, len(lines))
	for i, line := range lines {
		var out Decoded
		err := d.Decode([]byte(line), rules.Position{Topic: "t"}, &out)
		want[i] = fmt.Sprint(err) + renderEvents(&out)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var out Decoded
			for i, line := range lines {
				err := d.Decode([]byte(line), rules.Position{Topic: "t"}, &out)
				if got := fmt.Sprint(err) + renderEvents(&out); got != want[i] {
					t.Errorf("line %d decoded differently concurrently", i+1)
				}
			}
		})
	}
	wg.Wait()
}

// TestUnknownOpNamesTable checks that the error of an unknown operation
// type names the message's table, which the daemon covers with that
// table's fallback namespace, in every JSON format.
func TestUnknownOpNamesTable(t *testing.T) {
	for _, tc := range []struct{ name, value, db, table string }{
		{"debezium", `{"op":"x","after":{"id":1},"source":{"db":"shop","table":"users"}}`, "shop", "users"},
		{"debezium envelope", `{"schema":{},"payload":{"op":"x","after":{"id":1},"source":{"db":"shop","table":"users"}}}`, "shop", "users"},
		{"flat", `{"id":1,"__op":"x","__db":"shop","__table":"users"}`, "shop", "users"},
		{"maxwell", `{"database":"shop","table":"users","type":"upsert","data":{"id":1}}`, "shop", "users"},
		{"canal", `{"data":[{"id":"1"}],"database":"shop","table":"users","isDdl":false,"type":"REPLACE"}`, "shop", "users"},
		{"maxwell without table", `{"database":"shop","type":"upsert","data":{"id":1}}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out Decoded
			err := (&Decoder{}).Decode([]byte(tc.value), rules.Position{}, &out)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want a *DecodeError", err)
			}
			if de.Database != tc.db || de.Table != tc.table || !strings.Contains(de.Reason, "unknown operation type") {
				t.Errorf("error %q names %q.%q, want %q.%q", err, de.Database, de.Table, tc.db, tc.table)
			}
		})
	}
}

// TestDuplicateMembersLastWins checks that of members whose names repeat,
// the last one counts at every level, as in encoding/json, whether the
// names were remembered from an earlier message or not.
func TestDuplicateMembersLastWins(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		op          rules.Operation
		table       string
		row         string // renderRow of the after image, else the before
	}{
		{"debezium op", `{"op":"c","op":"d","before":{"id":1,"active":1,"active":0},"source":{"db":"d","table":"t","table":"u"}}`, rules.Delete, "d.u", "id=int:1 active=int:0"},
		{"debezium envelope", `{"schema":{},"payload":{"op":"c","after":{"id":1}},"payload":{"op":"u","after":{"id":2,"id":3}}}`, rules.Update, "d.t", "id=int:3"},
		{"flat", `{"id":1,"__op":"d","__op":"c","active":1,"active":0,"__table":"t","__table":"u","__db":"d"}`, rules.Insert, "d.u", "id=int:1 active=int:0"},
		{"maxwell", `{"database":"d","table":"t","type":"delete","type":"insert","data":{"id":1,"id":2}}`, rules.Insert, "d.t", "id=int:2"},
		{"canal", `{"data":[{"id":"1","id":"2"}],"database":"d","table":"t","isDdl":false,"type":"DELETE","type":"INSERT","mysqlType":{"id":"varchar(3)","id":"int"}}`, rules.Insert, "d.t", "id=int:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out Decoded
			d := Decoder{Table: "d.t"}
			for range 3 { // the second and third read remembered names
				if err := d.Decode([]byte(tc.value), rules.Position{}, &out); err != nil {
					t.Fatal(err)
				}
				if len(out.Events) != 1 {
					t.Fatalf("%d events", len(out.Events))
				}
				e := out.Events[0]
				row := e.After
				if row == nil {
					row = e.Before
				}
				if e.Operation != tc.op || e.Database+"."+e.Table != tc.table || renderRow(row) != tc.row {
					t.Errorf("%v %s.%s %s, want %v %s %s", e.Operation, e.Database, e.Table, renderRow(row), tc.op, tc.table, tc.row)
				}
			}
		})
	}
}

// TestMessageRowBound checks that a message of more than MaxMessageRows
// rows is an error naming its table, and one of MaxMessageRows rows is not.
func TestMessageRowBound(t *testing.T) {
	msg := func(rows int) []byte {
		var b strings.Builder
		b.WriteString(`{"data":[`)
		for i := range rows {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"id":"%d"}`, i)
		}
		b.WriteString(`],"database":"shop","table":"users","isDdl":false,"type":"INSERT"}`)
		return []byte(b.String())
	}
	var out Decoded
	if err := (&Decoder{}).Decode(msg(MaxMessageRows), rules.Position{}, &out); err != nil || len(out.Events) != MaxMessageRows {
		t.Fatalf("%d rows: %d events, error %v", MaxMessageRows, len(out.Events), err)
	}
	err := (&Decoder{}).Decode(msg(MaxMessageRows+1), rules.Position{}, &out)
	var de *DecodeError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "data: more than 10000 rows in one message") || de.Table != "users" || len(out.Events) != 0 {
		t.Fatalf("%d rows: error %v (%+v), %d events", MaxMessageRows+1, err, de, len(out.Events))
	}
}
