package decode

import (
	"encoding/binary"
	"math/big"
	"os"
	"path/filepath"
	"testing"

	"github.com/hamba/avro/v2"
)

// avroFixture is a schema of testdata/avro, registered under an id: it
// encodes messages with the Avro library's encoder, framed as Confluent's
// serializer frames them, and is compiled into a cache for decoding.
type avroFixture struct {
	id     uint32
	text   string
	schema avro.Schema
	// api encodes: one of its own, since the library's default one
	// caches encoders by record name, and an evolved schema reuses the
	// names of its predecessor.
	api avro.API
}

func loadAvroFixture(t testing.TB, file string, id uint32) *avroFixture {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", "avro", file))
	if err != nil {
		t.Fatal(err)
	}
	return avroFixtureOf(t, string(text), id)
}

// avroFixtureOf is the fixture of a schema text.
func avroFixtureOf(t testing.TB, text string, id uint32) *avroFixture {
	t.Helper()
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatalf("schema %d: %v", id, err)
	}
	return &avroFixture{id: id, text: text, schema: s, api: avro.Config{}.Freeze()}
}

// encode returns the framed message of v (maps as the library takes
// them: a union's non-null record or logical value wrapped in a map keyed
// by the branch's name).
func (f *avroFixture) encode(t testing.TB, v any) []byte {
	t.Helper()
	body, err := f.api.Marshal(f.schema, v)
	if err != nil {
		t.Fatalf("encode with schema %d: %v", f.id, err)
	}
	return frameAvro(f.id, body)
}

// frameAvro prepends the Confluent header: magic byte 0 and the id.
func frameAvro(id uint32, body []byte) []byte {
	out := make([]byte, avroHeaderLen, avroHeaderLen+len(body))
	binary.BigEndian.PutUint32(out[1:], id)
	return append(out, body...)
}

// avroCache compiles the fixtures into a cache.
func avroCache(t testing.TB, fixtures ...*avroFixture) *AvroSchemaCache {
	t.Helper()
	c := &AvroSchemaCache{}
	for _, f := range fixtures {
		s, err := CompileAvroSchema(f.id, f.text)
		if err != nil {
			t.Fatal(err)
		}
		c.Add(s)
	}
	return c
}

// orderRow is a row of the orders table (testdata/avro/orders-*.avsc),
// the row of the decode benchmarks.
func orderRow(status string, paid bool, updated int64, version int32) map[string]any {
	return map[string]any{
		"id": int64(1000042), "customer_id": int64(20771), "status": status, "currency": "EUR",
		"total_cents": int64(129900), "items": int32(3), "coupon": nil, "paid": paid,
		"note": map[string]any{"string": "leave at the door"}, "created_at": int64(1718000000000),
		"updated_at": updated, "version": version,
	}
}

// mysqlSource is the source block of a binlog change of shop.<table>.
func mysqlSource(table string) map[string]any {
	return map[string]any{
		"version": "2.7.3.Final", "connector": "mysql", "name": "shop", "ts_ms": int64(1718000123000),
		"snapshot": map[string]any{"string": "false"}, "db": "shop", "sequence": nil, "ts_us": nil, "ts_ns": nil,
		"table": map[string]any{"string": table}, "server_id": int64(223344),
		"gtid": map[string]any{"string": "3e11fa47-71ca-11e1-9e33-c80aa9429562:23871"},
		"file": "mysql-bin.000042", "pos": int64(81231), "row": int32(0),
		"thread": map[string]any{"long": int64(19)}, "query": nil,
	}
}

// ordersEnvelope is a change event of the orders table; nil images are
// absent.
func ordersEnvelope(op string, before, after map[string]any) map[string]any {
	wrap := func(r map[string]any) any {
		if r == nil {
			return nil
		}
		return map[string]any{"shop.shop.orders.Value": r}
	}
	return map[string]any{
		"before": wrap(before), "after": wrap(after), "source": mysqlSource("orders"), "transaction": nil,
		"op": op, "ts_ms": map[string]any{"long": int64(1718000123512)}, "ts_us": nil, "ts_ns": nil,
	}
}

// decimalRat is v as the library's encoder takes a decimal.
func decimalRat(t testing.TB, v string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(v)
	if !ok {
		t.Fatalf("bad decimal %q", v)
	}
	return r
}
