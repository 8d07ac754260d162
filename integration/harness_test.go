package integration

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/decode"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// newWorkload creates the schema in a fresh database and returns a
// workload on it.
func newWorkload(t *testing.T, opts WorkloadOptions) (*Workload, *Schema, string) {
	t.Helper()
	db, dsn := testsvc.MySQL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := NewSchema("", "")
	if err := schema.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(ctx, db, schema, opts, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("workload seed %d, binlog positions: %v", w.Seed(), w.BinlogPositions())
	return w, schema, dsn
}

// sameRow compares row images column by column: the same columns, NULL in
// the same places and the same text, except DATETIME columns (Debezium
// sends epoch milliseconds) whose text is not compared.
func sameRow(t *Table, want, got rules.Row) string {
	if (want == nil) != (got == nil) {
		return fmt.Sprintf("image present: want %v, got %v", want != nil, got != nil)
	}
	if len(want) != len(got) {
		return fmt.Sprintf("want %d columns, got %d", len(want), len(got))
	}
	for _, w := range want {
		g, ok := got.Get(w.Name)
		if !ok {
			return fmt.Sprintf("column %s missing", w.Name)
		}
		if w.Value.IsNull() != g.IsNull() {
			return fmt.Sprintf("column %s: want %v, got %v", w.Name, w.Value, g)
		}
		col, _ := t.Column(w.Name)
		if col.SQLType == "datetime" || w.Value.IsNull() {
			continue
		}
		if w.Value.Text != g.Text {
			return fmt.Sprintf("column %s: want %q, got %q (%s)", w.Name, w.Value.Text, g.Text, g.Kind)
		}
	}
	return ""
}

// TestEncodeDecodes checks the harness's encoders against the daemon's
// decoders: every message of every format decodes into the row changes
// the workload made in MariaDB, in order.
func TestEncodeDecodes(t *testing.T) {
	w, schema, _ := newWorkload(t, WorkloadOptions{KeyMoves: true})
	ctx := context.Background()
	initial, err := w.Initial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	txs := []Tx{{Desc: "snapshot", Changes: initial}}
	// The workload is random: rounds go on (4 at least, 40 at most) until
	// it has made every kind of change the encoders must carry.
	wanted := []string{"users update", "user_interests key change", "comments insert", "comments update", "comments delete", "products update"}
	kinds := map[string]int{}
	missing := func() bool {
		for _, k := range wanted {
			if kinds[k] == 0 {
				return true
			}
		}
		return false
	}
	for i := 0; i < 40 && (i < 4 || missing()); i++ {
		round, err := w.Round(ctx, 25)
		if err != nil {
			t.Fatal(err)
		}
		txs = append(txs, round...)
		for _, tx := range round {
			for _, c := range tx.Changes {
				kinds[c.Event.Table+" "+c.Event.Operation.String()]++
				if c.pkChanged() {
					kinds[c.Event.Table+" key change"]++
				}
			}
		}
	}
	for _, k := range wanted {
		if kinds[k] == 0 {
			t.Errorf("the workload made no %q change in 40 rounds; made %v", k, kinds)
		}
	}
	topicTables := map[string]string{}
	for _, tb := range schema.Tables() {
		topicTables[DefaultTopic(tb)] = tb.Qualified()
	}
	for _, f := range Formats {
		t.Run(string(f), func(t *testing.T) {
			dec := decode.Decoder{Format: f.Decoder(), TopicTables: topicTables}
			var reg *AvroRegistry
			var schemas *kafka.SchemaRegistry
			if f.Avro() {
				if reg, err = StartAvroRegistry(); err != nil {
					t.Fatal(err)
				}
				defer reg.Close()
				if schemas, err = kafka.NewSchemaRegistry(kafka.RegistryConfig{URLs: []string{reg.URL()}}, nil, nil); err != nil {
					t.Fatal(err)
				}
				dec.Schemas = schemas.Cache()
			}
			var want, got []rules.Event
			var out decode.Decoded
			for _, tx := range txs {
				if tx.Desc == "snapshot" && !f.SupportsSnapshot() {
					continue
				}
				want = append(want, f.Events(tx.Changes)...)
				msgs, err := Encode(f, tx.Changes, nil, reg)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range msgs {
					if id, ok := decode.AvroSchemaID(m.Value); ok && schemas != nil {
						if err := schemas.Fetch(ctx, []uint32{id}); err != nil {
							t.Fatal(err)
						}
					}
					if err := dec.Decode(m.Value, rules.Position{Topic: m.Topic}, &out); err != nil {
						t.Fatalf("%s: decode %s: %v", tx.Desc, m.Value, err)
					}
					if out.Skip != "" && (m.Value != nil || out.Skip != decode.SkipTombstone) {
						t.Fatalf("%s: message skipped (%s): %s", tx.Desc, out.Skip, m.Value)
					}
					for _, ev := range out.Events {
						ev.Before, ev.After = cloneRow(ev.Before), cloneRow(ev.After)
						got = append(got, ev)
					}
				}
			}
			if len(got) != len(want) {
				t.Fatalf("decoded %d events, want %d", len(got), len(want))
			}
			for i := range want {
				wv, gv := want[i], got[i]
				tb := schemaTable(schema, wv.Table)
				where := fmt.Sprintf("event %d (%s %s.%s)", i, wv.Operation, wv.Database, wv.Table)
				if gv.Database != wv.Database || gv.Table != wv.Table || gv.Operation != wv.Operation {
					t.Fatalf("%s: decoded as %s %s.%s", where, gv.Operation, gv.Database, gv.Table)
				}
				if d := sameRow(tb, wv.Before, gv.Before); d != "" {
					t.Fatalf("%s: before image: %s", where, d)
				}
				if d := sameRow(tb, wv.After, gv.After); d != "" {
					t.Fatalf("%s: after image: %s", where, d)
				}
				if f != DebeziumFlatRow && f != DebeziumFlat && f != Canal && wv.Operation != rules.Read {
					if gv.Source.BinlogPos != wv.Source.BinlogPos || gv.Source.BinlogFile != wv.Source.BinlogFile {
						t.Fatalf("%s: source position %s:%d, want %s:%d", where, gv.Source.BinlogFile, gv.Source.BinlogPos,
							wv.Source.BinlogFile, wv.Source.BinlogPos)
					}
				}
			}
		})
	}
}

// cloneRow copies a decoded image, which the next Decode overwrites.
func cloneRow(r rules.Row) rules.Row {
	if r == nil {
		return nil
	}
	return append(make(rules.Row, 0, len(r)), r...)
}

func schemaTable(s *Schema, name string) *Table {
	for _, t := range s.Tables() {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// TestBrokerRoundTrip publishes a workload's messages and reads them back
// from the broker: same count, same order per partition.
func TestBrokerRoundTrip(t *testing.T) {
	w, schema, _ := newWorkload(t, WorkloadOptions{KeyMoves: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var topics []string
	for _, tb := range schema.Tables() {
		topics = append(topics, DefaultTopic(tb))
	}
	log := slog.New(slog.DiscardHandler)
	b, err := StartBroker(ctx, log, BrokerOptions{Addrs: testsvc.Kafka(), Topics: topics, Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pub, err := NewPublisher(b.Addrs(), Debezium, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	before, err := b.EndOffsets(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	round, err := w.Round(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	var want []OutMessage
	for _, tx := range round {
		msgs, err := Encode(Debezium, tx.Changes, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, msgs...)
		if _, err := pub.Publish(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	// Per topic and key, the values must come back in publish order.
	wantByKey := map[string][]string{}
	for _, m := range want {
		k := m.Topic + " " + string(m.Key)
		wantByKey[k] = append(wantByKey[k], string(m.Value))
	}
	gotByKey := map[string][]string{}
	total := 0
	for _, topic := range topics {
		msgs, err := b.ReadAll(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Offset < before[topic][m.Partition] {
				continue
			}
			total++
			k := topic + " " + string(m.Key)
			gotByKey[k] = append(gotByKey[k], string(m.Value))
		}
	}
	if total != len(want) {
		t.Fatalf("read %d messages back, published %d", total, len(want))
	}
	for k, vals := range wantByKey {
		if strings.Join(gotByKey[k], "\n") != strings.Join(vals, "\n") {
			t.Errorf("key %s: messages out of order or changed:\ngot  %q\nwant %q", k, gotByKey[k], vals)
		}
	}
}

// TestBinlogPositions runs the workload on a server with its binary log
// on: every transaction's changes carry the position SHOW MASTER STATUS
// reports after its commit, and positions grow.
func TestBinlogPositions(t *testing.T) {
	db, _ := testsvc.MySQLBinlog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := NewSchema("", "")
	if err := schema.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(ctx, db, schema, WorkloadOptions{KeyMoves: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if !w.BinlogPositions() {
		t.Fatal("log_bin is on but the workload makes positions up")
	}
	if _, err := w.Initial(ctx); err != nil {
		t.Fatal(err)
	}
	txs, err := w.Round(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
	var lastFile string
	var lastPos int64
	for _, tx := range txs {
		src := tx.Changes[0].Event.Source
		if src.BinlogFile == "" || src.BinlogPos <= 0 {
			t.Fatalf("%s: no binlog position: %+v", tx.Desc, src)
		}
		for _, c := range tx.Changes {
			if c.Event.Source.BinlogFile != src.BinlogFile || c.Event.Source.BinlogPos != src.BinlogPos {
				t.Errorf("%s: changes of one transaction at different positions", tx.Desc)
			}
		}
		if src.BinlogFile < lastFile || (src.BinlogFile == lastFile && src.BinlogPos <= lastPos) {
			t.Errorf("%s: position %s:%d does not follow %s:%d", tx.Desc, src.BinlogFile, src.BinlogPos, lastFile, lastPos)
		}
		lastFile, lastPos = src.BinlogFile, src.BinlogPos
	}
	// The Debezium encoding carries the position to the decoder.
	msgs, err := Encode(Debezium, txs[len(txs)-1].Changes, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out decode.Decoded
	if err := (&decode.Decoder{}).Decode(msgs[0].Value, rules.Position{}, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.Events[0].Source; got.BinlogFile != lastFile || got.BinlogPos != lastPos {
		t.Errorf("decoded position %s:%d, want %s:%d", got.BinlogFile, got.BinlogPos, lastFile, lastPos)
	}
}
