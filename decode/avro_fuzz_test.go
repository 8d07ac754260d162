package decode

import (
	"errors"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// FuzzDecodeAvro decodes arbitrary bodies framed with the id of each
// Debezium schema of testdata/avro: Decode never panics, fails only with
// a *DecodeError whose offset lies in the message, and otherwise yields
// well-formed events or a skip.
func FuzzDecodeAvro(f *testing.F) {
	fixtures := []*avroFixture{
		loadAvroFixture(f, "types-envelope.avsc", 1),
		loadAvroFixture(f, "orders-envelope.avsc", 2),
		loadAvroFixture(f, "orders-flat.avsc", 3),
		loadAvroFixture(f, "transaction.avsc", 4),
		loadAvroFixture(f, "schema-change.avsc", 5),
		loadAvroFixture(f, "types-key.avsc", 6),
	}
	schemas := avroCache(f, fixtures...)
	row, _ := typesRow(f)
	f.Add(uint8(1), fixtures[0].encode(f, typesEnvelope("u", row, row))[avroHeaderLen:])
	f.Add(uint8(2), fixtures[1].encode(f, ordersEnvelope("d", orderRow("paid", true, 1, 2), nil))[avroHeaderLen:])
	flatRow := orderRow("paid", true, 1, 2)
	flatRow["__op"], flatRow["__deleted"] = "c", "false"
	f.Add(uint8(3), fixtures[2].encode(f, flatRow)[avroHeaderLen:])
	f.Add(uint8(6), fixtures[5].encode(f, map[string]any{"id": int32(1), "code": "x"})[avroHeaderLen:])
	f.Add(uint8(1), []byte{0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	decoders := []Decoder{
		{Schemas: schemas, Table: "d.t"},
		{Format: FormatAvro, Schemas: schemas, Table: "d.t"},
		{Format: FormatDebezium, Schemas: schemas, Table: "d.t"},
		{Format: FormatDebeziumFlat, Schemas: schemas, Table: "d.t"},
	}
	f.Fuzz(func(t *testing.T, id uint8, body []byte) {
		msg := frameAvro(uint32(id), body)
		var out Decoded
		for _, d := range decoders {
			err := d.Decode(msg, rules.Position{Topic: "t"}, &out)
			if err != nil {
				var de *DecodeError
				if !errors.As(err, &de) {
					t.Fatalf("%v: error %T is not a *DecodeError: %v", d.Format, err, err)
				}
				if de.Offset > len(msg) {
					t.Fatalf("%v: error offset %d beyond message length %d", d.Format, de.Offset, len(msg))
				}
				if len(out.Events) != 0 {
					t.Fatalf("%v: error with %d events", d.Format, len(out.Events))
				}
				continue
			}
			checkEvents(t, d.Format, &out)
		}
		d := decoders[0]
		d.KeyColumns(msg)
	})
}
