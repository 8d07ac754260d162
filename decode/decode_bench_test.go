package decode

import (
	"encoding/json"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// Realistic single-row messages of about 800 bytes: an orders row of 12
// columns, as each producer writes it.
const (
	benchDebezium = `{"before":{"id":1000042,"customer_id":20771,"status":"pending","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":false,"note":"leave at the door","created_at":1718000000000,"updated_at":1718000000000,"version":7},` +
		`"after":{"id":1000042,"customer_id":20771,"status":"paid","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":true,"note":"leave at the door","created_at":1718000000000,"updated_at":1718000123456,"version":8},` +
		`"source":{"version":"2.7.3.Final","connector":"mysql","name":"shop","ts_ms":1718000123000,"snapshot":"false","db":"shop","sequence":null,"table":"orders","server_id":223344,"gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:23871","file":"mysql-bin.000042","pos":81231,"row":0,"thread":19,"query":null},` +
		`"op":"u","ts_ms":1718000123512,"transaction":null}`

	benchFlat = `{"id":1000042,"customer_id":20771,"status":"paid","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":true,"note":"leave at the door, ring twice, the dog is friendly","shipping_address":"Hauptstrasse 12, 10115 Berlin","billing_address":"Hauptstrasse 12, 10115 Berlin","created_at":1718000000000,"updated_at":1718000123456,"version":8,` +
		`"__op":"u","__db":"shop","__table":"orders","__source_ts_ms":1718000123000,"__source_file":"mysql-bin.000042","__source_pos":81231,"__source_gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:23871","__deleted":"false"}`

	benchMaxwell = `{"database":"shop","table":"orders","type":"update","ts":1718000123,"xid":940521,"commit":true,"position":"mysql-bin.000042:81231","gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:23871","server_id":223344,"thread_id":19,"primary_key":[1000042],"primary_key_columns":["id"],` +
		`"data":{"id":1000042,"customer_id":20771,"status":"paid","currency":"EUR","total_cents":129900,"items":3,"coupon":null,"paid":1,"note":"leave at the door, ring twice, the dog is friendly","shipping_address":"Hauptstrasse 12, 10115 Berlin","created_at":"2024-06-10 06:13:20","updated_at":"2024-06-10 06:15:23.456000","version":8},` +
		`"old":{"status":"pending","paid":0,"updated_at":"2024-06-10 06:13:20","version":7}}`

	benchCanal = `{"data":[{"id":"1000042","customer_id":"20771","status":"paid","currency":"EUR","total_cents":"129900","items":"3","coupon":null,"paid":"1","note":"leave at the door","created_at":"2024-06-10 06:13:20","updated_at":"2024-06-10 06:15:23","version":"8"}],` +
		`"database":"shop","es":1718000123000,"id":5521,"isDdl":false,` +
		`"mysqlType":{"id":"bigint(20)","customer_id":"bigint(20)","status":"varchar(16)","currency":"char(3)","total_cents":"bigint(20)","items":"int(11)","coupon":"varchar(32)","paid":"tinyint(1)","note":"varchar(255)","created_at":"datetime","updated_at":"datetime","version":"int(11)"},` +
		`"old":[{"status":"pending","paid":"0","updated_at":"2024-06-10 06:13:20","version":"7"}],"pkNames":["id"],"sql":"",` +
		`"sqlType":{"id":-5,"customer_id":-5,"status":12,"currency":1,"total_cents":-5,"items":4,"coupon":12,"paid":-6,"note":12,"created_at":93,"updated_at":93,"version":4},"table":"orders","ts":1718000123512,"type":"UPDATE"}`
)

// BenchmarkDecode decodes one message per iteration into a reused Decoded.
// Run with -benchmem; "B/msg" is the message size.
func BenchmarkDecode(b *testing.B) {
	cases := []struct {
		name  string
		dec   Decoder
		value string
	}{
		{"debezium", Decoder{Format: FormatDebezium}, benchDebezium},
		{"debezium-auto", Decoder{}, benchDebezium},
		{"debezium-flat", Decoder{Format: FormatDebeziumFlat}, benchFlat},
		{"maxwell", Decoder{Format: FormatMaxwell}, benchMaxwell},
		{"canal", Decoder{Format: FormatCanal}, benchCanal},
		{"debezium-envelope", Decoder{Format: FormatDebezium}, fixtureLine(b, "debezium-mysql-with-schema.ndjson", 10)},
		{"avro", benchAvroDecoder(b), benchAvroMessage(b)},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			in := []byte(tc.value)
			var out Decoded
			pos := rules.Position{Topic: "shop.orders", Partition: 3, Offset: 1}
			if err := tc.dec.Decode(in, pos, &out); err != nil || len(out.Events) != 1 {
				b.Fatalf("Decode: %v (%d events)", err, len(out.Events))
			}
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := tc.dec.Decode(in, pos, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(in)), "B/msg")
		})
	}
}

// BenchmarkValidateFloor sets the decoder against checking the same
// Debezium message's JSON and nothing else: with this package's own
// validating skip (the least work the decoder's contract allows: every
// byte checked, nothing extracted) and with encoding/json.Valid
// (docs/benchmarks.md, "The ratio goals").
func BenchmarkValidateFloor(b *testing.B) {
	in := []byte(benchDebezium)
	pos := rules.Position{Topic: "shop.orders", Partition: 3, Offset: 1}
	b.Run("decode", func(b *testing.B) {
		dec := Decoder{Format: FormatDebezium}
		var out Decoded
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if err := dec.Decode(in, pos, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("skip", func(b *testing.B) {
		var sc scanner
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			sc.reset(benchDebezium, in)
			if !sc.skip() || sc.i != len(in) {
				b.Fatal("skip stopped early")
			}
		}
	})
	b.Run("encoding-json-valid", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if !json.Valid(in) {
				b.Fatal("invalid")
			}
		}
	})
}

// benchOrderRules are two rules that every bench message matches: a
// namespace bump whose listed columns changed and a counter whose `when`
// flips (a pending order becomes paid).
const benchOrderRules = `version: 1
prefix: "shop:"
rules:
  - name: order
    table: shop.orders
    columns: [status, total_cents, items]
    bump: "ns:order:{id}"
  - name: customer-paid-orders
    table: shop.orders
    when: "paid == 1"
    count:
      key: "paid-orders:{customer_id}"
      recount: "SELECT COUNT(*) FROM orders WHERE customer_id = ? AND paid = 1"
`

// BenchmarkDecodePlan is the per-event cost of the daemon's hot path
// before coalescing: decode one message and plan its row change against
// two matching rules, per format, with reused buffers.
func BenchmarkDecodePlan(b *testing.B) {
	rs, err := rulefile.Parse("bench.yaml", []byte(benchOrderRules))
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name  string
		dec   Decoder
		value string
		ops   int
	}{
		{"debezium", Decoder{Format: FormatDebezium}, benchDebezium, 2},
		{"debezium-auto", Decoder{}, benchDebezium, 2},
		// No before image: a bump and a recount.
		{"debezium-flat", Decoder{Format: FormatDebeziumFlat}, benchFlat, 2},
		{"maxwell", Decoder{Format: FormatMaxwell}, benchMaxwell, 2},
		{"canal", Decoder{Format: FormatCanal}, benchCanal, 2},
		// The debezium change, as Kafka Connect's AvroConverter writes it.
		{"avro", benchAvroDecoder(b), benchAvroMessage(b), 2},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			in := []byte(tc.value)
			var out Decoded
			var ops []rules.Op
			pos := rules.Position{Topic: "shop.orders", Partition: 3, Offset: 1}
			plan := func() {
				if err := tc.dec.Decode(in, pos, &out); err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
				for i := range out.Events {
					if ops, _, err = rs.Plan(ops, &out.Events[i]); err != nil {
						b.Fatal(err)
					}
				}
			}
			plan()
			if len(ops) != tc.ops {
				b.Fatalf("%d ops planned, want %d: %+v", len(ops), tc.ops, ops)
			}
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				plan()
			}
		})
	}
}
