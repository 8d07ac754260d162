package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/cachewarden/cachewarden/internal/debeziumavro"
	"github.com/cachewarden/cachewarden/rules"
)

// AvroRegistry is a schema registry served in this process over HTTP
// with Confluent's REST API (franz-go's srfake), into which the workload's
// tables are registered as Debezium's AvroConverter registers them, on
// first use. It is safe for concurrent use.
type AvroRegistry struct {
	fake   *srfake.Registry
	client *sr.Client

	mu       sync.Mutex
	encoders map[string]*debeziumavro.Encoder // by topic
}

// StartAvroRegistry starts a registry; Close stops it.
func StartAvroRegistry() (*AvroRegistry, error) {
	fake := srfake.New()
	cl, err := sr.NewClient(sr.URLs(fake.URL()))
	if err != nil {
		fake.Close()
		return nil, fmt.Errorf("integration: schema registry client: %w", err)
	}
	return &AvroRegistry{fake: fake, client: cl, encoders: map[string]*debeziumavro.Encoder{}}, nil
}

// URL is the registry's base URL (kafka.schema_registry.urls).
func (r *AvroRegistry) URL() string { return r.fake.URL() }

// Close stops the registry.
func (r *AvroRegistry) Close() { r.fake.Close() }

// encoder returns the encoder of t's changes on topic, registering its
// schemas the first time.
func (r *AvroRegistry) encoder(t *Table, topic string) (*debeziumavro.Encoder, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.encoders[topic]; ok {
		return e, nil
	}
	at := debeziumavro.Table{Topic: topic, Key: t.PK}
	for _, c := range t.Columns {
		at.Columns = append(at.Columns, debeziumavro.Column{Name: c.Name, Type: avroType(c), Optional: c.Null})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := debeziumavro.Register(ctx, r.client, at, false)
	if err != nil {
		return nil, fmt.Errorf("integration: %w", err)
	}
	r.encoders[topic] = e
	return e, nil
}

// avroType is the Avro type Debezium's MySQL connector gives a column
// with its default modes (DECIMAL precise, DATETIME as epoch ms).
func avroType(c ColumnDef) string {
	switch t := c.SQLType; {
	case strings.HasPrefix(t, "bigint"):
		return debeziumavro.Long
	case strings.HasPrefix(t, "tinyint"), strings.HasPrefix(t, "smallint"):
		return debeziumavro.Int16
	case strings.HasPrefix(t, "int"):
		return debeziumavro.Int
	case strings.HasPrefix(t, "decimal("):
		var precision, scale int
		fmt.Sscanf(t, "decimal(%d,%d)", &precision, &scale)
		return debeziumavro.Decimal(precision, scale)
	case t == "datetime":
		return debeziumavro.Timestamp
	}
	return debeziumavro.String
}

// avroRow converts a row image to the encoder's values: integers as
// int64 or int32, DECIMAL as its text, DATETIME as epoch milliseconds.
func avroRow(t *Table, r rules.Row) (map[string]any, error) {
	if r == nil {
		return nil, nil
	}
	out := make(map[string]any, len(r))
	for _, c := range r {
		col, _ := t.Column(c.Name)
		v, err := avroValue(col, c.Value)
		if err != nil {
			return nil, err
		}
		out[c.Name] = v
	}
	return out, nil
}

func avroValue(col ColumnDef, v rules.Value) (any, error) {
	if v.IsNull() {
		return nil, nil
	}
	switch avroType(col) {
	case debeziumavro.Long:
		return strconv.ParseInt(v.Text, 10, 64)
	case debeziumavro.Int, debeziumavro.Int16:
		n, err := strconv.ParseInt(v.Text, 10, 32)
		return int32(n), err
	case debeziumavro.Timestamp:
		ts, err := time.Parse(time.DateTime, v.Text)
		if err != nil {
			return nil, fmt.Errorf("integration: column %s: %w", col.Name, err)
		}
		return ts.UnixMilli(), nil
	}
	return v.Text, nil
}

// encodeDebeziumAvro encodes change c as Debezium's AvroConverter does:
// the envelope and the key, framed with their registry ids.
func encodeDebeziumAvro(reg *AvroRegistry, c *Change, topic string) (key, value []byte, err error) {
	if reg == nil {
		return nil, nil, fmt.Errorf("integration: format %s needs a schema registry", DebeziumAvro)
	}
	e, err := reg.encoder(c.Table, topic)
	if err != nil {
		return nil, nil, err
	}
	ev := &c.Event
	before, err := avroRow(c.Table, ev.Before)
	if err != nil {
		return nil, nil, err
	}
	after, err := avroRow(c.Table, ev.After)
	if err != nil {
		return nil, nil, err
	}
	img, err := avroRow(c.Table, c.image())
	if err != nil {
		return nil, nil, err
	}
	if key, err = e.Key(img); err != nil {
		return nil, nil, err
	}
	src := debeziumavro.Source{Name: connectorName, TsMs: ev.Source.TsMs, Snapshot: "false", DB: ev.Database, Table: ev.Table,
		ServerID: sourceServerID(ev.Source), File: ev.Source.BinlogFile, Pos: ev.Source.BinlogPos, Row: int32(c.Row), Thread: 7}
	if ev.Operation == rules.Read {
		src.Snapshot, src.ServerID, src.Thread = "true", 0, 0
		if c.SnapshotLast {
			src.Snapshot = "last"
		}
	}
	value, err = e.Envelope(debeziumOp(ev.Operation), before, after, src, ev.Source.TsMs+3)
	return key, value, err
}
