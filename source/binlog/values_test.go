package binlog

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
)

// typeCase is one column of testdata/types.json: a MySQL type, a value
// written to it, and that value as Debezium's MySQL connector (default
// settings, bigint.unsigned.handling.mode=precise) writes it in JSON.
type typeCase struct {
	Column   string          `json:"column"`
	Type     string          `json:"type"`
	SQL      string          `json:"sql"`
	Debezium json.RawMessage `json:"debezium"`
	// Scale, when set, makes the Debezium value a Connect Decimal of
	// that scale.
	Scale *int `json:"scale"`
	// Binlog, when set, is the value the binary log gives where it
	// cannot be Debezium's, and Note why.
	Binlog *struct {
		Kind, Text string
	} `json:"binlog"`
	Note string `json:"note"`
}

func loadTypes(t *testing.T) []typeCase {
	t.Helper()
	b, err := os.ReadFile("testdata/types.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []typeCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatalf("testdata/types.json: %v", err)
	}
	return cases
}

// debeziumValue is what the decode package makes of the case's Debezium
// JSON value.
func debeziumValue(t *testing.T, c typeCase) rules.Value {
	t.Helper()
	payload := `{"op":"c","before":null,"after":{"` + c.Column + `":` + string(c.Debezium) + `},"source":{"db":"d","table":"t"}}`
	msg := payload
	if c.Scale != nil {
		msg = `{"schema":{"type":"struct","fields":[{"type":"struct","fields":[` +
			`{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"` +
			strconv.Itoa(*c.Scale) + `"},"field":"` + c.Column + `"}],"optional":true,"field":"after"}]},"payload":` + payload + `}`
	}
	var out decode.Decoded
	if err := (&decode.Decoder{}).Decode([]byte(msg), rules.Position{}, &out); err != nil {
		t.Fatalf("%s: decode the Debezium value %s: %v", c.Column, msg, err)
	}
	v, ok := out.Events[0].After.Get(c.Column)
	if !ok {
		t.Fatalf("%s: decoded row lacks the column", c.Column)
	}
	return v
}

// want is the value the binary log must give for the case.
func (c typeCase) want(t *testing.T) rules.Value {
	deb := debeziumValue(t, c)
	if c.Binlog == nil {
		return deb
	}
	w := rules.Value{Text: c.Binlog.Text}
	switch c.Binlog.Kind {
	case "float":
		w.Kind = rules.KindFloat
	case "string":
		w.Kind = rules.KindString
	case "int":
		w.Kind = rules.KindInt
	default:
		t.Fatalf("%s: binlog kind %q", c.Column, c.Binlog.Kind)
	}
	if w == deb {
		t.Fatalf("%s: the fixture says the binary log differs from Debezium, but both give %v", c.Column, w)
	}
	return w
}

func TestValuesMatchDebezium(t *testing.T) {
	cases := loadTypes(t)
	for _, meta := range []string{"FULL", "NO_LOG"} {
		t.Run(meta, func(t *testing.T) {
			f := newFixture(t)
			setRowMetadata(t, f.db, meta)
			defs := []string{"id INT PRIMARY KEY"}
			cols, vals := []string{"id"}, []string{"1"}
			for _, c := range cases {
				defs = append(defs, c.Column+" "+c.Type)
				cols, vals = append(cols, c.Column), append(vals, c.SQL)
			}
			f.exec(t, "CREATE TABLE v ("+strings.Join(defs, ", ")+") CHARSET utf8mb4")
			s := f.open(t, f.position(t), nil)
			f.tx(t, true, "SET time_zone = '+02:00'", "SET sql_mode = ''",
				"INSERT INTO v ("+strings.Join(cols, ", ")+") VALUES ("+strings.Join(vals, ", ")+")")
			txn := next(t, s)
			if len(txn.Unmapped) != 0 || len(txn.Events) != 1 {
				t.Fatalf("got %d events and unmapped %v, want one insert", len(txn.Events), txn.Unmapped)
			}
			row := txn.Events[0].After
			for _, c := range cases {
				got, ok := row.Get(c.Column)
				if want := c.want(t); !ok || got != want {
					t.Errorf("%s %s = %s: binary log gives %s %q, Debezium's JSON %s %q (%s)", c.Column, c.Type, c.SQL, got.Kind, got.Text, want.Kind, want.Text, c.Note)
				}
			}
		})
	}
}

func TestToValue(t *testing.T) {
	colOf := func(tp byte, mod func(*column)) *column {
		c := &column{Name: "c", Type: tp}
		if mod != nil {
			mod(c)
		}
		return c
	}
	unsigned := func(c *column) { c.Unsigned = true }
	cases := []struct {
		name string
		col  *column
		in   any
		want rules.Value
		err  string
	}{
		{"null", colOf(mysql.MYSQL_TYPE_LONG, nil), nil, rules.Value{}, ""},
		{"unsigned tiny read as signed", colOf(mysql.MYSQL_TYPE_TINY, unsigned), int8(-1), rules.Value{Kind: rules.KindInt, Text: "255"}, ""},
		{"unsigned int24 read as signed", colOf(mysql.MYSQL_TYPE_INT24, unsigned), int32(-1), rules.Value{Kind: rules.KindInt, Text: "16777215"}, ""},
		{"unsigned bigint read as signed", colOf(mysql.MYSQL_TYPE_LONGLONG, unsigned), int64(-1), rules.Value{Kind: rules.KindInt, Text: "18446744073709551615"}, ""},
		{"unsigned bigint read as unsigned", colOf(mysql.MYSQL_TYPE_LONGLONG, unsigned), uint64(1 << 63), rules.Value{Kind: rules.KindInt, Text: "9223372036854775808"}, ""},
		{"signed stays signed", colOf(mysql.MYSQL_TYPE_LONG, nil), int32(-5), rules.Value{Kind: rules.KindInt, Text: "-5"}, ""},
		{"integer of a wrong type", colOf(mysql.MYSQL_TYPE_LONG, nil), "5", rules.Value{}, "integer decoded as string"},
		{"decimal", colOf(mysql.MYSQL_TYPE_NEWDECIMAL, nil), "-0.50", rules.Value{Kind: rules.KindFloat, Text: "-0.50"}, ""},
		{"decimal negative zero", colOf(mysql.MYSQL_TYPE_NEWDECIMAL, nil), "-0.00", rules.Value{Kind: rules.KindFloat, Text: "0.00"}, ""},
		{"decimal integer", colOf(mysql.MYSQL_TYPE_NEWDECIMAL, nil), "42", rules.Value{Kind: rules.KindInt, Text: "42"}, ""},
		{"decimal garbage", colOf(mysql.MYSQL_TYPE_NEWDECIMAL, nil), "4x2", rules.Value{}, "not digits"},
		{"float32", colOf(mysql.MYSQL_TYPE_FLOAT, nil), float32(0.1), rules.Value{Kind: rules.KindFloat, Text: "0.1"}, ""},
		{"bit(1) zero", colOf(mysql.MYSQL_TYPE_BIT, func(c *column) { c.Meta = 1 }), int64(0), rules.Value{Kind: rules.KindBool, Text: "0"}, ""},
		{"bit(64)", colOf(mysql.MYSQL_TYPE_BIT, func(c *column) { c.Meta = 8 << 8 }), int64(-1), rules.Value{Kind: rules.KindString, Text: "//////////8="}, ""},
		{"enum index 0", colOf(mysql.MYSQL_TYPE_ENUM, func(c *column) { c.Members = []string{"a"} }), int64(0), rules.Value{Kind: rules.KindString}, ""},
		{"enum index beyond", colOf(mysql.MYSQL_TYPE_ENUM, func(c *column) { c.Members = []string{"a"} }), int64(2), rules.Value{}, "outside the column's 1 members"},
		{"enum without members", colOf(mysql.MYSQL_TYPE_ENUM, nil), int64(1), rules.Value{}, "outside the column's 0 members"},
		{"set empty", colOf(mysql.MYSQL_TYPE_SET, func(c *column) { c.Members = []string{"a", "b"} }), int64(0), rules.Value{Kind: rules.KindString}, ""},
		{"set bit beyond", colOf(mysql.MYSQL_TYPE_SET, func(c *column) { c.Members = []string{"a", "b"} }), int64(4), rules.Value{}, "beyond the column's 2"},
		{"text bytes", colOf(mysql.MYSQL_TYPE_BLOB, nil), []byte("a b"), rules.Value{Kind: rules.KindString, Text: "a b"}, ""},
		{"blob", colOf(mysql.MYSQL_TYPE_BLOB, func(c *column) { c.Binary = true }), []byte{0xff}, rules.Value{Kind: rules.KindString, Text: "/w=="}, ""},
		{"varbinary string", colOf(mysql.MYSQL_TYPE_VARCHAR, func(c *column) { c.Binary = true }), "\x00", rules.Value{Kind: rules.KindString, Text: "AA=="}, ""},
		{"json text", colOf(mysql.MYSQL_TYPE_JSON, nil), `{"a":1}`, rules.Value{Kind: rules.KindString, Text: `{"a":1}`}, ""},
		{"json empty document", colOf(mysql.MYSQL_TYPE_JSON, nil), []byte{}, rules.Value{Kind: rules.KindString, Text: "null"}, ""},
		{"geometry too short", colOf(mysql.MYSQL_TYPE_GEOMETRY, nil), []byte{1}, rules.Value{}, "shorter than its 4-byte SRID"},
		{"datetime before 1970", colOf(mysql.MYSQL_TYPE_DATETIME2, nil), "1969-12-31 23:59:59", rules.Value{Kind: rules.KindInt, Text: "-1000"}, ""},
		{"datetime zero in date, nullable", colOf(mysql.MYSQL_TYPE_DATETIME2, func(c *column) { c.Nullable = true }), "2024-00-01 00:00:00", rules.Value{}, ""},
		{"date before 1970", colOf(mysql.MYSQL_TYPE_DATE, nil), "1969-12-31", rules.Value{Kind: rules.KindInt, Text: "-1"}, ""},
		{"timestamp(6)", colOf(mysql.MYSQL_TYPE_TIMESTAMP2, func(c *column) { c.Meta = 6 }), "2024-05-01 10:00:00.000001", rules.Value{Kind: rules.KindString, Text: "2024-05-01T10:00:00.000001Z"}, ""},
		{"time(2) negative fraction", colOf(mysql.MYSQL_TYPE_TIME2, func(c *column) { c.Meta = 2 }), "-00:00:01.50", rules.Value{Kind: rules.KindInt, Text: "-1500000"}, ""},
		{"datetime garbage", colOf(mysql.MYSQL_TYPE_DATETIME2, nil), "2024-05-01T10:00:00", rules.Value{}, "want YYYY-MM-DD HH:MM:SS"},
		{"time garbage", colOf(mysql.MYSQL_TYPE_TIME2, nil), "1:2:3", rules.Value{}, "want [-]HH:MM:SS"},
		{"unsupported type", colOf(mysql.MYSQL_TYPE_VECTOR, nil), []byte{1}, rules.Value{}, "not supported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := toValue(tc.col, tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("toValue(%v) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("toValue(%v) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
