package decode

import (
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/linkedin/goavro/v2"

	"github.com/cachewarden/cachewarden/rules"
)

// benchAvroID is the registry id of the bench's Avro schema.
const benchAvroID = 7

// benchAvroMessage is benchDebezium (the same update of the same orders
// row) framed and encoded as Kafka Connect's AvroConverter writes it.
func benchAvroMessage(b testing.TB) string {
	f := loadAvroFixture(b, "orders-envelope.avsc", benchAvroID)
	return string(f.encode(b, ordersEnvelope("u", orderRow("pending", false, 1718000000000, 7), orderRow("paid", true, 1718000123456, 8))))
}

// benchAvroDecoder decodes benchAvroMessage (format auto: detected by the
// magic byte), its schema cached as after warm-up.
func benchAvroDecoder(b testing.TB) Decoder {
	return Decoder{Schemas: avroCache(b, loadAvroFixture(b, "orders-envelope.avsc", benchAvroID))}
}

// BenchmarkAvroLibraries decodes the bench's Avro change event with each
// candidate: this package's decoder (schema parsed by hamba/avro,
// compiled once per schema id, values rendered into the event arena),
// hamba/avro's and goavro's generic decoding into Go maps (before any
// conversion to events). It is how the decoder was chosen (README,
// "Avro with a schema registry").
func BenchmarkAvroLibraries(b *testing.B) {
	msg := []byte(benchAvroMessage(b))
	body := msg[avroHeaderLen:]
	fx := loadAvroFixture(b, "orders-envelope.avsc", benchAvroID)
	b.Run("cachewarden", func(b *testing.B) {
		dec := benchAvroDecoder(b)
		var out Decoded
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			if err := dec.Decode(msg, rules.Position{}, &out); err != nil || len(out.Events) != 1 {
				b.Fatal(err)
			}
		}
	})
	b.Run("hamba-generic", func(b *testing.B) {
		schema, err := avro.ParseWithCache(fx.text, "", &avro.SchemaCache{})
		if err != nil {
			b.Fatal(err)
		}
		api := avro.Config{}.Freeze()
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]any
			if err := api.Unmarshal(schema, body, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("goavro-generic", func(b *testing.B) {
		codec, err := goavro.NewCodec(fx.text)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := codec.NativeFromBinary(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
