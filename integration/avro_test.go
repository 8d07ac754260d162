package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// TestAvroPlansLikeJSON publishes a workload's changes (snapshot and
// rounds, primary-key moves included) as Debezium writes them in JSON
// and with the AvroConverter, decodes both as the daemon does and plans
// them with the end-to-end rules (every rule kind): the planned ops, keys
// and members byte for byte, are the same, and so are the columns the
// message keys name (the ordering check of set rules).
func TestAvroPlansLikeJSON(t *testing.T) {
	w, _, _ := newWorkload(t, WorkloadOptions{KeyMoves: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rs, err := rulefile.LoadPaths(testRules)
	if err != nil {
		t.Fatal(err)
	}
	initial, err := w.Initial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	txs := []Tx{{Desc: "snapshot", Changes: initial}}
	for range 6 {
		round, err := w.Round(ctx, 25)
		if err != nil {
			t.Fatal(err)
		}
		txs = append(txs, round...)
	}
	reg, err := StartAvroRegistry()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	schemas, err := kafka.NewSchemaRegistry(kafka.RegistryConfig{URLs: []string{reg.URL()}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	jsonDec := &decode.Decoder{Format: decode.FormatDebezium}
	avroDec := &decode.Decoder{Format: decode.FormatAvro, Schemas: schemas.Cache()}
	plan := func(dec *decode.Decoder, msgs []OutMessage) (ops, keys []string) {
		t.Helper()
		var out decode.Decoded
		for _, m := range msgs {
			for _, b := range [][]byte{m.Key, m.Value} {
				if id, ok := decode.AvroSchemaID(b); ok {
					if err := schemas.Fetch(ctx, []uint32{id}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := dec.Decode(m.Value, rules.Position{Topic: m.Topic}, &out); err != nil {
				t.Fatalf("%s: %v", dec.Format, err)
			}
			var st rules.PlanStats
			planned, err := decode.PlanMessage(rs, out.Events, nil, &st, nil)
			if err != nil {
				t.Fatalf("%s: plan: %v", dec.Format, err)
			}
			for _, op := range planned {
				ops = append(ops, fmt.Sprintf("%s %s %q %q %d", op.Rule.Name, op.Kind, op.Key, op.Member, op.Delta))
			}
			cols, perTable, named := dec.KeyColumns(m.Key)
			keys = append(keys, fmt.Sprint(cols, perTable, named))
		}
		return ops, keys
	}
	var total int
	for _, tx := range txs {
		jm, err := Encode(Debezium, tx.Changes, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		am, err := Encode(DebeziumAvro, tx.Changes, nil, reg)
		if err != nil {
			t.Fatal(err)
		}
		jOps, jKeys := plan(jsonDec, jm)
		aOps, aKeys := plan(avroDec, am)
		if !slices.Equal(jOps, aOps) {
			t.Fatalf("%s: ops differ\njson:\n%s\navro:\n%s", tx.Desc, strings.Join(jOps, "\n"), strings.Join(aOps, "\n"))
		}
		if !slices.Equal(jKeys, aKeys) {
			t.Fatalf("%s: message key columns differ\njson: %v\navro: %v", tx.Desc, jKeys, aKeys)
		}
		total += len(aOps)
	}
	if total < 50 {
		t.Errorf("only %d ops planned: the comparison proves little", total)
	}
	t.Logf("%d transactions, %d ops planned alike", len(txs), total)
}
