package cdc

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cachewarden/cachewarden/rules"
)

// FuzzDecode checks, for every format, that Decode never panics, that it
// either fails with a *DecodeError, skips, or yields well-formed events,
// and that it accepts exactly the JSON objects encoding/json accepts (up to
// the nesting bound). For flattened rows it also compares every value with
// encoding/json's reading of it.
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
			}
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
	compareRowWithJSON(t, row, top)
}

// compareRowWithJSON checks every column of row against obj, encoding/json's
// reading of the object it was decoded from.
func compareRowWithJSON(t *testing.T, row rules.Row, top map[string]json.RawMessage) {
	t.Helper()
	seen := map[string]int{}
	for _, c := range row {
		seen[c.Name]++
	}
	for _, c := range row {
		raw, ok := top[c.Name]
		if !ok {
			t.Fatalf("column %q not in encoding/json's object", c.Name)
		}
		if seen[c.Name] > 1 {
			continue // duplicate names: encoding/json keeps the last
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
		if len(img.row) != len(obj) && !hasDuplicateNames(img.row) {
			t.Fatalf("%s: %d columns, encoding/json reads %d", img.name, len(img.row), len(obj))
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
	if !ok && valid && !strings.Contains(st.sc.errMsg, "nesting deeper") && !strings.Contains(st.sc.errMsg, "duplicate payload") {
		t.Fatalf("scanner rejected valid JSON %q: %s at %d", value, st.sc.errMsg, st.sc.errOff)
	}
}
