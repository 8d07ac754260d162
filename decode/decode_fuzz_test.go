package decode

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cachewarden/cachewarden/rules"
)

// FuzzDecode checks, for every format, that Decode never panics, that it
// either fails with a *DecodeError, skips, or yields well-formed events,
// and that it accepts exactly the JSON objects encoding/json accepts (up to
// the nesting bound). For every JSON format it also compares the
// operation and every row value with encoding/json's map decoding of the
// same input: of duplicate members, at any level, the last one counts.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "decode", "*.ndjson"))
	for _, file := range files {
		for _, line := range fixtureLines(f, filepath.Base(file)) {
			f.Add([]byte(line))
		}
	}
	for _, s := range []string{
		"", "null", "{}", "[]", `{"schema":{},"payload":null}`, `{"ts_ms":1}`,
		`{"a":"\ud83d\ude00\u00e9\\\"","__op":"c","__table":"t","__db":"d","b":[{"c":{}}],"n":-0.0e+1}`,
		`{"op":"c","after":{"x":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `},"source":{"db":"d","table":"t"}}`,
		decimalEnvelope("2", `"AQ=="`),
		`{"op":"c","op":"d","before":{"id":1,"active":1,"active":0},"source":{"db":"d","table":"t","table":"u"}}`,
		`{"schema":{},"payload":{"op":"c","after":{"id":1}},"payload":{"op":"u","after":{"id":2,"id":3}}}`,
		`{"id":1,"__op":"d","__op":"c","active":1,"active":0,"__table":"t","__table":"u","__db":"d"}`,
		`{"database":"d","table":"t","type":"delete","type":"update","data":{"id":1,"id":2},"old":{"a":1,"a":2}}`,
		`{"data":[{"id":"1","id":"2"}],"old":[{"a":"1","a":"0"}],"database":"d","table":"t","isDdl":false,"type":"INSERT","type":"UPDATE","mysqlType":{"id":"int","id":"varchar(3)"}}`,
		`{"op":"x","after":{"id":1},"source":{"db":"d","table":"t"}}`,
	} {
		f.Add([]byte(s))
	}
	// warm[k] has decoded the inputs before this one with decoder k: it
	// must decode each as a new Decoded does (see keyCache).
	warm := make([]Decoded, len(fuzzDecoders))
	f.Fuzz(func(t *testing.T, value []byte) {
		var out Decoded
		for k, d := range fuzzDecoders {
			compareWarmDecode(t, d, &warm[k], value)
			err := d.Decode(value, rules.Position{Topic: "t"}, &out)
			if err != nil {
				var de *DecodeError
				if !errors.As(err, &de) {
					t.Fatalf("%v: error %T is not a *DecodeError: %v", d.Format, err, err)
				}
				if de.Offset > len(value) {
					t.Fatalf("%v: error offset %d beyond message length %d", d.Format, de.Offset, len(value))
				}
				if len(out.Events) != 0 {
					t.Fatalf("%v: error with %d events", d.Format, len(out.Events))
				}
				continue
			}
			checkEvents(t, d.Format, &out)
			if out.Skip == "" && !json.Valid(value) {
				t.Fatalf("%v: decoded invalid JSON %q", d.Format, value)
			}
			switch {
			case d.Format == FormatDebeziumFlat:
				compareFlatWithJSON(t, value, &out)
			case d.Format == FormatDebezium:
				compareDebeziumWithJSON(t, value, &out)
			case d.Format == FormatMaxwell:
				compareMaxwellWithJSON(t, value, &out)
			case d.Format == FormatCanal:
				compareCanalWithJSON(t, value, &out)
			}
			compareOpWithJSON(t, value, &out)
		}
		checkSyntaxAgreement(t, value)
	})
}

func checkEvents(t *testing.T, f Format, out *Decoded) {
	t.Helper()
	if out.Skip != "" && len(out.Events) != 0 {
		t.Fatalf("%v: skip %q with %d events", f, out.Skip, len(out.Events))
	}
	if out.Skip == "" && len(out.Events) == 0 {
		t.Fatalf("%v: no events and no skip reason", f)
	}
	for _, e := range out.Events {
		if e.Table == "" || e.Database == "" {
			t.Fatalf("%v: event without table: %+v", f, e)
		}
		switch e.Operation {
		case rules.Insert, rules.Read:
			if e.After == nil || e.Before != nil {
				t.Fatalf("%v: %v with before=%v after=%v", f, e.Operation, e.Before, e.After)
			}
		case rules.Update:
			if e.After == nil {
				t.Fatalf("%v: update without after image", f)
			}
		case rules.Delete:
			if e.Before == nil || e.After != nil {
				t.Fatalf("%v: delete with before=%v after=%v", f, e.Before, e.After)
			}
		case rules.Truncate:
			if e.Before != nil || e.After != nil {
				t.Fatalf("%v: truncate with row images", f)
			}
		default:
			t.Fatalf("%v: invalid operation %d", f, e.Operation)
		}
		for _, r := range []rules.Row{e.Before, e.After} {
			for _, c := range r {
				if c.Value.Kind > rules.KindJSON {
					t.Fatalf("%v: column %q has invalid kind %d", f, c.Name, c.Value.Kind)
				}
			}
		}
	}
}

// fuzzDecoders are the decoders FuzzDecode tries on every input.
var fuzzDecoders = []Decoder{
	{},
	{Format: FormatDebezium, Table: "d.t"},
	{Format: FormatDebeziumFlat, Table: "d.t"},
	{Format: FormatMaxwell, Table: "d.t"},
	{Format: FormatCanal, Table: "d.t"},
	{Keep: NewColumnSet([]string{"id", "a"})},
}

// compareFlatWithJSON checks every column of a flattened row against
// encoding/json's decoding of the same message.
func compareFlatWithJSON(t *testing.T, value []byte, out *Decoded) {
	t.Helper()
	if out.Skip != "" || !utf8.Valid(value) {
		return
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(value, &top); err != nil {
		return
	}
	if _, ok := top["payload"]; ok && len(top) == 2 {
		if _, ok := top["schema"]; ok {
			return // envelope: values may have been converted by the schema
		}
	}
	row := out.Events[0].After
	if row == nil {
		row = out.Events[0].Before
	}
	for k := range top {
		if strings.HasPrefix(k, "__") {
			delete(top, k)
		}
	}
	compareRowWithJSON(t, row, top)
}

// compareRowWithJSON checks every column of row against obj, encoding/json's
// reading of the object it was decoded from: the same names, once each,
// with the same values (the last of duplicate members).
func compareRowWithJSON(t *testing.T, row rules.Row, top map[string]json.RawMessage) {
	t.Helper()
	compareRowWithJSONTyped(t, row, top, false)
}

// compareRowWithJSONTyped is compareRowWithJSON; with typed, a string may
// have been typed as a number (Canal's mysqlType) and keep its text.
func compareRowWithJSONTyped(t *testing.T, row rules.Row, top map[string]json.RawMessage, typed bool) {
	t.Helper()
	if hasDuplicateNames(row) {
		t.Fatalf("row %v has duplicate column names", row)
	}
	if len(row) != len(top) {
		t.Fatalf("row has %d columns, encoding/json reads %d: %v", len(row), len(top), row)
	}
	for _, c := range row {
		raw, ok := top[c.Name]
		if !ok {
			t.Fatalf("column %q not in encoding/json's object", c.Name)
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("column %q: %v", c.Name, err)
		}
		switch x := v.(type) {
		case nil:
			if c.Value.Kind != rules.KindNull {
				t.Fatalf("column %q: got %v, want null", c.Name, c.Value)
			}
		case bool:
			want := "0"
			if x {
				want = "1"
			}
			if c.Value.Kind != rules.KindBool || c.Value.Text != want {
				t.Fatalf("column %q: got %v, want bool %v", c.Name, c.Value, x)
			}
		case string:
			if typed && (c.Value.Kind == rules.KindInt || c.Value.Kind == rules.KindFloat) && c.Value.Text == x {
				break
			}
			if c.Value.Kind != rules.KindString || c.Value.Text != x {
				t.Fatalf("column %q: got %v, want string %q", c.Name, c.Value, x)
			}
		case json.Number:
			if (c.Value.Kind != rules.KindInt && c.Value.Kind != rules.KindFloat) || c.Value.Text != string(x) {
				t.Fatalf("column %q: got %v, want number %s", c.Name, c.Value, x)
			}
			if isInt := !strings.ContainsAny(string(x), ".eE"); isInt != (c.Value.Kind == rules.KindInt) {
				t.Fatalf("column %q: number %s decoded as %v", c.Name, x, c.Value.Kind)
			}
		default:
			if c.Value.Kind != rules.KindJSON || !json.Valid([]byte(c.Value.Text)) {
				t.Fatalf("column %q: got %v, want raw JSON", c.Name, c.Value)
			}
		}
	}
}

// compareDebeziumWithJSON checks a decoded Debezium envelope (without a
// schema block) against encoding/json's reading of it: each row image
// column by column, the event's table and operation, and the source
// position fields the decoder keeps.
func compareDebeziumWithJSON(t *testing.T, value []byte, out *Decoded) {
	t.Helper()
	if out.Skip != "" || len(out.Events) != 1 || !utf8.Valid(value) {
		return
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(value, &top); err != nil {
		return
	}
	if _, ok := top["payload"]; ok {
		return // envelope: values may have been converted by the schema
	}
	e := out.Events[0]
	var tableName string
	if json.Unmarshal(top["source"], &struct {
		Table *string `json:"table"`
	}{&tableName}) == nil && tableName != "" && e.Table != tableName {
		t.Fatalf("table %q, encoding/json reads %q", e.Table, tableName)
	}
	for _, img := range []struct {
		name string
		row  rules.Row
	}{{"before", e.Before}, {"after", e.After}} {
		var obj map[string]json.RawMessage
		raw, ok := top[img.name]
		if !ok || json.Unmarshal(raw, &obj) != nil || obj == nil {
			if img.row != nil && e.Operation != rules.Update {
				t.Fatalf("%s: decoded %v from %s", img.name, img.row, raw)
			}
			continue
		}
		if img.row == nil {
			continue // an update's before image may be left out of the event
		}
		compareRowWithJSON(t, img.row, obj)
	}
	var src map[string]json.RawMessage
	if json.Unmarshal(top["source"], &src) != nil {
		return
	}
	// The decoder reads these members as encoding/json does (the last of
	// duplicates wins); an empty or non-string name leaves the table to
	// the decoder's default, a negative position or time is ignored.
	if raw, ok := src["table"]; ok {
		var table string
		if json.Unmarshal(raw, &table) == nil && table != "" && e.Table != table {
			t.Fatalf("table %q, encoding/json reads %q", e.Table, table)
		}
	}
	if raw, ok := src["file"]; ok {
		var file string
		if json.Unmarshal(raw, &file) == nil && file != "" && e.Source.BinlogFile != file {
			t.Fatalf("binlog file %q, encoding/json reads %q", e.Source.BinlogFile, file)
		}
	}
	for _, m := range []struct {
		name string
		got  int64
	}{{"pos", e.Source.BinlogPos}, {"ts_ms", e.Source.TsMs}} {
		var n json.Number
		if json.Unmarshal(src[m.name], &n) != nil {
			continue
		}
		if want, err := n.Int64(); err == nil && want > 0 && m.got != want {
			t.Fatalf("source %s %d, encoding/json reads %d", m.name, m.got, want)
		}
	}
}

// compareMaxwellWithJSON checks the row images of a Maxwell event against
// encoding/json's reading of data and old.
func compareMaxwellWithJSON(t *testing.T, value []byte, out *Decoded) {
	t.Helper()
	if out.Skip != "" || len(out.Events) != 1 || !utf8.Valid(value) {
		return
	}
	var top struct {
		Data map[string]json.RawMessage
		Old  map[string]json.RawMessage
	}
	if json.Unmarshal(value, &top) != nil || top.Data == nil {
		return
	}
	e := out.Events[0]
	switch e.Operation {
	case rules.Delete:
		compareRowWithJSON(t, e.Before, top.Data)
	case rules.Update:
		compareRowWithJSON(t, e.After, top.Data)
		compareRowWithJSON(t, e.Before, overlayJSON(top.Data, top.Old))
	default:
		compareRowWithJSON(t, e.After, top.Data)
	}
}

// compareCanalWithJSON checks the row images of a Canal message's events
// against encoding/json's reading of data and old.
func compareCanalWithJSON(t *testing.T, value []byte, out *Decoded) {
	t.Helper()
	if out.Skip != "" || !utf8.Valid(value) {
		return
	}
	var top struct {
		Data []map[string]json.RawMessage
		Old  []map[string]json.RawMessage
	}
	if json.Unmarshal(value, &top) != nil || len(top.Data) != len(out.Events) {
		return // a TRUNCATE
	}
	for i, e := range out.Events {
		switch e.Operation {
		case rules.Delete:
			compareRowWithJSONTyped(t, e.Before, top.Data[i], true)
		case rules.Update:
			compareRowWithJSONTyped(t, e.After, top.Data[i], true)
			var old map[string]json.RawMessage
			if i < len(top.Old) {
				old = top.Old[i]
			}
			compareRowWithJSONTyped(t, e.Before, overlayJSON(top.Data[i], old), true)
		default:
			compareRowWithJSONTyped(t, e.After, top.Data[i], true)
		}
	}
}

func overlayJSON(base, old map[string]json.RawMessage) map[string]json.RawMessage {
	m := make(map[string]json.RawMessage, len(base)+len(old))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range old {
		m[k] = v
	}
	return m
}

// compareOpWithJSON checks the operation of the events against the
// operation member as encoding/json reads it (the last of duplicates).
func compareOpWithJSON(t *testing.T, value []byte, out *Decoded) {
	t.Helper()
	if out.Skip != "" || len(out.Events) == 0 || !utf8.Valid(value) {
		return
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(value, &top) != nil {
		return
	}
	if p, ok := top["payload"]; ok && len(top) == 2 {
		if _, ok := top["schema"]; ok && json.Unmarshal(p, &top) != nil {
			return
		}
	}
	var op, typ, flatOp string
	json.Unmarshal(top["op"], &op)
	json.Unmarshal(top["type"], &typ)
	json.Unmarshal(top["__op"], &flatOp)
	var want []rules.Operation
	switch out.Format {
	case FormatDebezium:
		want = map[string][]rules.Operation{"c": {rules.Insert, rules.Read}, "u": {rules.Update}, "d": {rules.Delete}, "r": {rules.Read}, "t": {rules.Truncate}}[op]
	case FormatDebeziumFlat:
		want = map[string][]rules.Operation{"": {rules.Update}, "c": {rules.Insert}, "u": {rules.Update}, "d": {rules.Delete}, "r": {rules.Read}, "t": {rules.Truncate}}[flatOp]
		var del any
		json.Unmarshal(top["__deleted"], &del)
		if del == true || del == "true" {
			want = []rules.Operation{rules.Delete}
		}
	case FormatMaxwell:
		want = map[string][]rules.Operation{"insert": {rules.Insert}, "update": {rules.Update}, "delete": {rules.Delete}, "bootstrap-insert": {rules.Read}}[typ]
	case FormatCanal:
		want = map[string][]rules.Operation{"INSERT": {rules.Insert}, "UPDATE": {rules.Update}, "DELETE": {rules.Delete}, "INIT": {rules.Read}, "TRUNCATE": {rules.Truncate}}[typ]
	}
	for _, e := range out.Events {
		if !slices.Contains(want, e.Operation) {
			t.Fatalf("%v: operation %v, encoding/json reads op %q type %q __op %q", out.Format, e.Operation, op, typ, flatOp)
		}
	}
}

func hasDuplicateNames(r rules.Row) bool {
	seen := map[string]bool{}
	for _, c := range r {
		if seen[c.Name] {
			return true
		}
		seen[c.Name] = true
	}
	return false
}

// checkSyntaxAgreement checks that the scanner accepts a top-level object
// exactly when encoding/json does, except for nesting beyond maxDepth.
func checkSyntaxAgreement(t *testing.T, value []byte) {
	t.Helper()
	s := strings.TrimLeft(string(value), " \t\r\n")
	if !strings.HasPrefix(s, "{") {
		return
	}
	var st decodeState
	st.reset(string(value), value)
	st.sc.skipWS()
	ok := st.fields(&st.top, &st.topIdx, true)
	if ok {
		st.sc.skipWS()
		ok = st.sc.i == len(value)
	}
	valid := json.Valid(value)
	if ok && !valid {
		t.Fatalf("scanner accepted invalid JSON %q", value)
	}
	if !ok && valid && !strings.Contains(st.sc.errMsg, "nesting deeper") {
		t.Fatalf("scanner rejected valid JSON %q: %s at %d", value, st.sc.errMsg, st.sc.errOff)
	}
}
