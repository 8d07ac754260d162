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
	decoders := []Decoder{
		{},
		{Format: FormatDebezium, Table: "d.t"},
		{Format: FormatDebeziumFlat, Table: "d.t"},
		{Format: FormatMaxwell, Table: "d.t"},
		{Format: FormatCanal, Table: "d.t"},
		{Keep: NewColumnSet([]string{"id", "a"})},
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		var out Decoded
		for _, d := range decoders {
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
			if d.Format == FormatDebeziumFlat {
				compareFlatWithJSON(t, value, &out)
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
