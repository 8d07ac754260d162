package decode

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// typesRow is a row of the types table (testdata/avro/types-envelope.avsc)
// with one value of every type, and want its rendering.
func typesRow(t testing.TB) (row map[string]any, want string) {
	row = map[string]any{
		"id": int32(7), "code": "A 1%", "tiny": int32(1), "small": nil,
		"big":          int64(math.MinInt64),
		"big_unsigned": decimalRat(t, "18446744073709551615"),
		"flag":         true,
		"price":        decimalRat(t, "-12.50"),
		"rate":         decimalRat(t, "0.0001"),
		"ratio":        float32(3.14),
		"weight":       1e10,
		"born":         int32(18460),
		"made_at":      int64(1718000000000),
		"made_at_us":   int64(1718000000123456),
		"seen_at":      "2024-06-10T06:13:20Z",
		"opens":        int64(64822000000),
		"year":         int32(2024),
		"state":        "paid",
		"doc":          `{"a": [1, 2], "b": "x\ny"}`,
		"blob":         []byte{0, 1, 2, 0xff},
		"bits":         []byte{0x0f},
		"note":         nil,
		"amount":       map[string]any{"io.debezium.data.VariableScaleDecimal": map[string]any{"scale": int32(3), "value": []byte{0x30, 0x39}}},
		"place": map[string]any{"io.debezium.data.geometry.Point": map[string]any{
			"x": 1.5, "y": -2.0, "wkb": map[string]any{"bytes": []byte{1}}, "srid": nil}},
	}
	want = `id=int:7 code=string:A 1% tiny=int:1 small=null: big=int:-9223372036854775808 ` +
		`big_unsigned=int:18446744073709551615 flag=bool:1 price=float:-12.50 rate=float:0.0001 ` +
		`ratio=float:3.14 weight=float:1.0E10 born=int:18460 made_at=int:1718000000000 ` +
		`made_at_us=int:1718000000123456 seen_at=string:2024-06-10T06:13:20Z opens=int:64822000000 ` +
		`year=int:2024 state=string:paid doc=string:{"a": [1, 2], "b": "x\ny"} blob=string:AAEC/w== ` +
		`bits=string:Dw== note=null: amount=float:12.345 place=json:{"x":1.5,"y":-2.0,"wkb":"AQ==","srid":null}`
	return row, want
}

func typesEnvelope(op string, before, after map[string]any) map[string]any {
	m := ordersEnvelope(op, nil, nil)
	m["source"] = mysqlSource("types")
	if before != nil {
		m["before"] = map[string]any{"shop.shop.types.Value": before}
	}
	if after != nil {
		m["after"] = map[string]any{"shop.shop.types.Value": after}
	}
	return m
}

// TestAvroValues decodes a row holding every type Debezium's MySQL
// connector writes (and VariableScaleDecimal and a geometry): each value
// renders as the JSON path renders it, decimals as exact digits.
func TestAvroValues(t *testing.T) {
	env := loadAvroFixture(t, "types-envelope.avsc", 11)
	row, want := typesRow(t)
	dec := Decoder{Schemas: avroCache(t, env)}
	var out Decoded
	msg := env.encode(t, typesEnvelope("c", nil, row))
	if err := dec.Decode(msg, rules.Position{Topic: "shop.shop.types", Offset: 9}, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Events) != 1 || out.Format != FormatAvro {
		t.Fatalf("%d events, format %s", len(out.Events), out.Format)
	}
	ev := out.Events[0]
	if ev.Operation != rules.Insert || ev.Database != "shop" || ev.Table != "types" || ev.Before != nil {
		t.Errorf("event %s %s.%s before %v", ev.Operation, ev.Database, ev.Table, ev.Before)
	}
	if got := renderRow(ev.After); got != want {
		t.Errorf("after:\n got %s\nwant %s", got, want)
	}
	wantSrc := rules.Position{Topic: "shop.shop.types", Offset: 9, BinlogFile: "mysql-bin.000042", BinlogPos: 81231,
		GTID: "3e11fa47-71ca-11e1-9e33-c80aa9429562:23871", ServerID: 223344, TsMs: 1718000123000}
	if ev.Source != wantSrc {
		t.Errorf("source %+v, want %+v", ev.Source, wantSrc)
	}
}

// TestAvroValuesOutliveDecoded: values rendered from Avro (numbers,
// base64) stay as they were after later messages are decoded into the
// same Decoded, as planned ops keep them until their batch is applied.
func TestAvroValuesOutliveDecoded(t *testing.T) {
	env := loadAvroFixture(t, "types-envelope.avsc", 11)
	row, want := typesRow(t)
	dec := Decoder{Schemas: avroCache(t, env)}
	var out Decoded
	if err := dec.Decode(env.encode(t, typesEnvelope("c", nil, row)), rules.Position{}, &out); err != nil {
		t.Fatal(err)
	}
	kept := slices.Clone(out.Events[0].After)
	for i := range 500 {
		other, _ := typesRow(t)
		other["id"], other["big"], other["blob"] = int32(1000+i), int64(-i*7919), []byte{byte(i), 9, 9, 9}
		if err := dec.Decode(env.encode(t, typesEnvelope("c", nil, other)), rules.Position{}, &out); err != nil {
			t.Fatal(err)
		}
	}
	if got := renderRow(kept); got != want {
		t.Errorf("first row after 500 more decodes:\n got %s\nwant %s", got, want)
	}
}

// TestAvroOperations decodes every Debezium op of the orders table in
// Avro and checks each event against the decoding of the same change in
// JSON (the bench message and its variants): the same operation, table,
// images and source position.
func TestAvroOperations(t *testing.T) {
	env := loadAvroFixture(t, "orders-envelope.avsc", 21)
	avroDec := Decoder{Schemas: avroCache(t, env)}
	before := orderRow("pending", false, 1718000000000, 7)
	after := orderRow("paid", true, 1718000123456, 8)
	jsonBefore := `{"id":1000042,"customer_id":20771,"status":"pending","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":false,"note":"leave at the door","created_at":1718000000000,"updated_at":1718000000000,"version":7}`
	jsonAfter := `{"id":1000042,"customer_id":20771,"status":"paid","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":true,"note":"leave at the door","created_at":1718000000000,"updated_at":1718000123456,"version":8}`
	source := func(snapshot string) string {
		return `"source":{"version":"2.7.3.Final","connector":"mysql","name":"shop","ts_ms":1718000123000,"snapshot":"` + snapshot + `","db":"shop","sequence":null,"table":"orders","server_id":223344,"gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:23871","file":"mysql-bin.000042","pos":81231,"row":0,"thread":19,"query":null}`
	}
	cases := []struct {
		name, op, snapshot string
		before, after      map[string]any
		jsonB, jsonA       string
		want               rules.Operation
	}{
		{"insert", "c", "false", nil, after, "null", jsonAfter, rules.Insert},
		{"update", "u", "false", before, after, jsonBefore, jsonAfter, rules.Update},
		{"update without before", "u", "false", nil, after, "null", jsonAfter, rules.Update},
		{"delete", "d", "false", before, nil, jsonBefore, "null", rules.Delete},
		{"read", "r", "true", nil, after, "null", jsonAfter, rules.Read},
		{"old snapshot create", "c", "last", nil, after, "null", jsonAfter, rules.Read},
		{"truncate", "t", "false", nil, nil, "null", "null", rules.Truncate},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := ordersEnvelope(tc.op, tc.before, tc.after)
			m["source"].(map[string]any)["snapshot"] = map[string]any{"string": tc.snapshot}
			pos := rules.Position{Topic: "shop.shop.orders", Partition: 1, Offset: 5}
			var a, j Decoded
			if err := avroDec.Decode(env.encode(t, m), pos, &a); err != nil {
				t.Fatal(err)
			}
			js := `{"before":` + tc.jsonB + `,"after":` + tc.jsonA + `,` + source(tc.snapshot) + `,"op":"` + tc.op + `","ts_ms":1718000123512,"transaction":null}`
			if err := (&Decoder{}).Decode([]byte(js), pos, &j); err != nil {
				t.Fatal(err)
			}
			if len(a.Events) != 1 || len(j.Events) != 1 {
				t.Fatalf("avro %d events, json %d", len(a.Events), len(j.Events))
			}
			if a.Events[0].Operation != tc.want {
				t.Errorf("op %s, want %s", a.Events[0].Operation, tc.want)
			}
			assertSameEvent(t, &a.Events[0], &j.Events[0])
		})
	}
}

func assertSameEvent(t *testing.T, a, j *rules.Event) {
	t.Helper()
	if a.Operation != j.Operation || a.Database != j.Database || a.Table != j.Table {
		t.Errorf("avro %s %s.%s, json %s %s.%s", a.Operation, a.Database, a.Table, j.Operation, j.Database, j.Table)
	}
	if ra, rj := renderRow(a.Before), renderRow(j.Before); ra != rj {
		t.Errorf("before:\navro %s\njson %s", ra, rj)
	}
	if ra, rj := renderRow(a.After), renderRow(j.After); ra != rj {
		t.Errorf("after:\navro %s\njson %s", ra, rj)
	}
	if a.Source != j.Source {
		t.Errorf("source:\navro %+v\njson %+v", a.Source, j.Source)
	}
}

// TestAvroPlansLikeJSON plans the bench change in Avro and in JSON
// against rules of every kind: the ops, keys byte for byte, are the same.
func TestAvroPlansLikeJSON(t *testing.T) {
	rs, err := rulefile.Parse("r.yaml", []byte(`version: 1
prefix: "shop:"
rules:
  - name: order
    table: shop.orders
    columns: [status, total_cents, items]
    bump: "ns:order:{id}:{note}"
  - name: customer-status
    table: shop.orders
    on: [insert, update, delete, read]
    set:
      key: "orders-by-status:{customer_id}:{status}"
      member: "{id}"
  - name: customer-paid-orders
    table: shop.orders
    when: "paid == 1 && total_cents > 1000"
    count:
      key: "paid-orders:{customer_id}"
`))
	if err != nil {
		t.Fatal(err)
	}
	env := loadAvroFixture(t, "orders-envelope.avsc", 21)
	avroDec := Decoder{Schemas: avroCache(t, env)}
	msg := env.encode(t, ordersEnvelope("u", orderRow("pending", false, 1718000000000, 7), orderRow("paid", true, 1718000123456, 8)))
	var a, j Decoded
	pos := rules.Position{Topic: "shop.shop.orders"}
	if err := avroDec.Decode(msg, pos, &a); err != nil {
		t.Fatal(err)
	}
	if err := (&Decoder{}).Decode([]byte(benchDebezium), pos, &j); err != nil {
		t.Fatal(err)
	}
	var st rules.PlanStats
	opsA, errA := PlanMessage(rs, a.Events, nil, &st, nil)
	opsJ, errJ := PlanMessage(rs, j.Events, nil, &st, nil)
	if errA != nil || errJ != nil {
		t.Fatal(errA, errJ)
	}
	if len(opsA) != 4 {
		t.Errorf("%d ops planned, want a bump, a set remove and add, and a count: %+v", len(opsA), opsA)
	}
	if render(opsA) != render(opsJ) {
		t.Errorf("ops differ:\navro %s\njson %s", render(opsA), render(opsJ))
	}
}

func render(ops []rules.Op) string {
	var b strings.Builder
	for _, op := range ops {
		b.WriteString(op.Kind.String() + " " + op.Key + " " + op.Member + "|")
	}
	return b.String()
}

// TestAvroFlattened decodes rows flattened by ExtractNewRecordState.
func TestAvroFlattened(t *testing.T) {
	flat := loadAvroFixture(t, "orders-flat.avsc", 31)
	dec := Decoder{Schemas: avroCache(t, flat)}
	row := func(op, deleted any) map[string]any {
		r := orderRow("paid", true, 1718000123456, 8)
		r["__op"], r["__deleted"] = op, deleted
		r["__db"], r["__table"], r["__source_ts_ms"] = "shop", "orders", int64(1718000123000)
		return r
	}
	cases := []struct {
		name       string
		op, del    any
		want       rules.Operation
		beforeOnly bool
	}{
		{"insert", "c", "false", rules.Insert, false},
		{"update", "u", "false", rules.Update, false},
		{"no __op", nil, nil, rules.Update, false},
		{"read", "r", "false", rules.Read, false},
		{"delete", "d", "true", rules.Delete, true},
		{"rewritten delete", "u", "true", rules.Delete, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out Decoded
			if err := dec.Decode(flat.encode(t, row(tc.op, tc.del)), rules.Position{Topic: "x"}, &out); err != nil {
				t.Fatal(err)
			}
			if len(out.Events) != 1 {
				t.Fatalf("%d events", len(out.Events))
			}
			ev := out.Events[0]
			img := ev.After
			if tc.beforeOnly {
				img = ev.Before
				if ev.After != nil {
					t.Errorf("delete with an after image")
				}
			} else if ev.Before != nil {
				t.Errorf("flattened row with a before image")
			}
			if ev.Operation != tc.want || ev.Database != "shop" || ev.Table != "orders" || ev.Source.TsMs != 1718000123000 {
				t.Errorf("event %s %s.%s ts %d", ev.Operation, ev.Database, ev.Table, ev.Source.TsMs)
			}
			if got := renderRow(img); !strings.HasPrefix(got, "id=int:1000042 customer_id=int:20771 status=string:paid") || strings.Contains(got, "__") {
				t.Errorf("row %s", got)
			}
		})
	}
}

// TestAvroSkipped: Debezium's side records carry no row change; the
// transaction block of an envelope is read past.
func TestAvroSkipped(t *testing.T) {
	tx := loadAvroFixture(t, "transaction.avsc", 41)
	hb := loadAvroFixture(t, "heartbeat.avsc", 42)
	sc := loadAvroFixture(t, "schema-change.avsc", 43)
	env := loadAvroFixture(t, "orders-envelope.avsc", 44)
	dec := Decoder{Schemas: avroCache(t, tx, hb, sc, env)}
	withTx := ordersEnvelope("c", nil, orderRow("paid", true, 1, 1))
	withTx["transaction"] = map[string]any{"event.block": map[string]any{"id": "file=mysql-bin.000042,pos=81000", "total_order": int64(3), "data_collection_order": int64(2)}}
	cases := []struct {
		name string
		msg  []byte
		skip string
	}{
		{"transaction", tx.encode(t, map[string]any{"status": "END", "id": "t1", "event_count": map[string]any{"long": int64(2)},
			"data_collections": map[string]any{"array": []any{map[string]any{"data_collection": "shop.orders", "event_count": int64(2)}}}, "ts_ms": int64(5)}), SkipTransaction},
		{"heartbeat", hb.encode(t, map[string]any{"ts_ms": int64(5)}), SkipHeartbeat},
		{"schema change", sc.encode(t, map[string]any{"source": mysqlSource("orders"), "ts_ms": int64(5), "databaseName": "shop", "schemaName": nil,
			"ddl": "ALTER TABLE orders ADD COLUMN x INT", "tableChanges": []any{}}), SkipSchemaChange},
		{"envelope with a transaction block", env.encode(t, withTx), ""},
	}
	for _, tc := range cases {
		var out Decoded
		if err := dec.Decode(tc.msg, rules.Position{}, &out); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if out.Skip != tc.skip || (tc.skip == "") != (len(out.Events) == 1) {
			t.Errorf("%s: skip %q with %d events, want %q", tc.name, out.Skip, len(out.Events), tc.skip)
		}
	}
}

// TestAvroSchemaEvolution: a column added, then dropped, mid-stream:
// each message is read with the schema its id names.
func TestAvroSchemaEvolution(t *testing.T) {
	v1 := loadAvroFixture(t, "orders-envelope.avsc", 51)
	added := strings.Replace(v1.text, `{"name": "version", "type": "int"}`, `{"name": "version", "type": "int"},
        {"name": "channel", "type": ["null", "string"], "default": null}`, 1)
	dropped := strings.Replace(v1.text, `{"name": "currency", "type": "string"},`, ``, 1)
	if added == v1.text || dropped == v1.text {
		t.Fatal("fixture changed: the schema edits did not apply")
	}
	v2 := avroFixtureOf(t, added, 52)
	v3 := avroFixtureOf(t, dropped, 53)
	dec := Decoder{Schemas: avroCache(t, v1, v2, v3)}
	r1 := orderRow("paid", true, 1, 8)
	r2 := orderRow("paid", true, 1, 8)
	r2["channel"] = "web"
	r3 := orderRow("paid", true, 1, 8)
	delete(r3, "currency")
	msgs := []struct {
		f    *avroFixture
		row  map[string]any
		cols string
	}{
		{v1, r1, "currency=string:EUR total_cents"},
		{v2, r2, "version=int:8 channel=string:web"},
		{v1, r1, "version=int:8"},
		{v3, r3, "status=string:paid total_cents"},
		{v2, r2, "channel=string:web"},
	}
	var out Decoded
	for i, m := range msgs {
		if err := dec.Decode(m.f.encode(t, ordersEnvelope("c", nil, m.row)), rules.Position{}, &out); err != nil {
			t.Fatalf("message %d (schema %d): %v", i, m.f.id, err)
		}
		got := renderRow(out.Events[0].After)
		if !strings.Contains(got, m.cols) || (m.f != v2 && strings.Contains(got, "channel")) || (m.f == v3 && strings.Contains(got, "currency")) {
			t.Errorf("message %d (schema %d): %s", i, m.f.id, got)
		}
	}
}

// TestAvroErrors: what cannot be decoded is a DecodeError naming what,
// where and why; a message cut anywhere is one, never a panic.
func TestAvroErrors(t *testing.T) {
	env := loadAvroFixture(t, "types-envelope.avsc", 61)
	row, _ := typesRow(t)
	good := env.encode(t, typesEnvelope("u", row, row))
	dec := Decoder{Schemas: avroCache(t, env)}
	cases := []struct {
		name   string
		dec    Decoder
		msg    []byte
		errHas []string
	}{
		{"unknown schema id", dec, frameAvro(999, good[5:]), []string{"schema id 999 is unknown to the schema registry"}},
		{"no registry", Decoder{}, good, []string{"schema id 61", "no schema registry", "take JSON lines"}},
		{"header cut short", dec, []byte{0, 0, 1}, []string{"header cut short"}},
		{"trailing bytes", dec, append(slices.Clone(good), 0, 0), []string{"2 bytes after the Avro record", "schema id 61 (shop.shop.types.Envelope)"}},
		{"bad union branch", dec, append(frameAvro(61, nil), 0x08), []string{"before", "union branch 4 does not exist"}},
		{"format avro, JSON message", Decoder{Format: FormatAvro, Schemas: dec.Schemas}, []byte(`{"op":"c"}`), []string{"not Confluent-framed Avro", "'{'"}},
	}
	for _, tc := range cases {
		var out Decoded
		err := tc.dec.Decode(tc.msg, rules.Position{}, &out)
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: error %v, want a DecodeError", tc.name, err)
			continue
		}
		for _, s := range tc.errHas {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q lacks %q", tc.name, err, s)
			}
		}
		if len(out.Events) != 0 {
			t.Errorf("%s: %d events with the error", tc.name, len(out.Events))
		}
	}
	// Every cut of the message is an error that says it was cut short,
	// with the path of the value it was in.
	for n := avroHeaderLen; n < len(good); n++ {
		var out Decoded
		err := dec.Decode(good[:n], rules.Position{}, &out)
		if err == nil || !strings.Contains(err.Error(), "cut short") {
			t.Fatalf("cut at %d of %d bytes: %v", n, len(good), err)
		}
	}
	var out Decoded
	err := dec.Decode(good[:len(good)-40], rules.Position{}, &out)
	if !strings.Contains(err.Error(), "source.") {
		t.Errorf("error of a message cut in its source block names no path: %v", err)
	}
}

// TestAvroKeyColumns: an Avro key names the fields of its record schema,
// sorted, as a JSON key does; one whose schema is unknown names none.
func TestAvroKeyColumns(t *testing.T) {
	key := loadAvroFixture(t, "types-key.avsc", 71)
	dec := Decoder{Schemas: avroCache(t, key)}
	k := key.encode(t, map[string]any{"id": int32(5), "code": "x"})
	cols, perTable, ok := dec.KeyColumns(k)
	if !ok || perTable || strings.Join(cols, ",") != "code,id" {
		t.Errorf("KeyColumns = %v, %v, %v", cols, perTable, ok)
	}
	if _, _, ok := dec.KeyColumns(k[:len(k)-1]); ok {
		t.Errorf("a key cut short names columns")
	}
	if _, _, ok := (&Decoder{}).KeyColumns(k); ok {
		t.Errorf("a key without its schema names columns")
	}
	if cols, _, ok := dec.KeyColumns([]byte(`{"id":1}`)); !ok || cols[0] != "id" {
		t.Errorf("JSON key: %v %v", cols, ok)
	}
}

func TestAppendJavaFloat(t *testing.T) {
	cases := []struct {
		f    float64
		bits int
		want string
	}{
		{0, 64, "0.0"}, {math.Copysign(0, -1), 64, "-0.0"}, {1, 64, "1.0"}, {100, 64, "100.0"},
		{1.5, 64, "1.5"}, {-2, 64, "-2.0"}, {0.1, 64, "0.1"}, {0.001, 64, "0.001"}, {0.0001, 64, "1.0E-4"},
		{1234567, 64, "1234567.0"}, {12345678, 64, "1.2345678E7"}, {1e10, 64, "1.0E10"}, {1e-10, 64, "1.0E-10"},
		{3.140000104904175, 64, "3.140000104904175"}, {float64(float32(3.14)), 32, "3.14"}, {float64(float32(123.102)), 32, "123.102"},
		{math.MaxFloat64, 64, "1.7976931348623157E308"}, {0.30000000000000004, 64, "0.30000000000000004"},
	}
	for _, tc := range cases {
		if got := string(appendJavaFloat(nil, tc.f, tc.bits)); got != tc.want {
			t.Errorf("%v (%d bits): %s, want %s", tc.f, tc.bits, got, tc.want)
		}
	}
}
