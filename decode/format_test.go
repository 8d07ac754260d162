package decode

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// TestDebeziumOpLetters pins what every op letter Debezium documents
// means, in the envelope ("op") and in a flattened row ("__op"): c create,
// u update, d delete, r read (snapshot), t truncate, m a logical decoding
// message (no row: skipped). Both shapes read the letters from one table.
func TestDebeziumOpLetters(t *testing.T) {
	const (
		row      = `{"id":1}`
		source   = `"source":{"db":"shop","table":"users"}`
		envelope = `{"op":%q,"before":%s,"after":%s,` + source + `}`
		flat     = `{"id":1,"__op":%q,"__db":"shop","__table":"users"}`
	)
	cases := []struct {
		letter string
		// before and after images of the envelope ("null" when absent).
		before, after string
		op            rules.Operation
		skip          string
		flatOp        rules.Operation // op of the flattened row
	}{
		{"c", "null", row, rules.Insert, "", rules.Insert},
		{"u", row, row, rules.Update, "", rules.Update},
		{"d", row, "null", rules.Delete, "", rules.Delete},
		{"r", "null", row, rules.Read, "", rules.Read},
		{"t", "null", "null", rules.Truncate, "", rules.Truncate},
		{"m", "null", "null", 0, SkipMessage, 0},
	}
	if len(cases) != len(debeziumOps) {
		t.Errorf("%d letters pinned here, %d in debeziumOps", len(cases), len(debeziumOps))
	}
	for _, tc := range cases {
		t.Run(tc.letter, func(t *testing.T) {
			shapes := []struct {
				name, msg string
				format    Format
				op        rules.Operation
			}{
				{"envelope", fmt.Sprintf(envelope, tc.letter, tc.before, tc.after), FormatDebezium, tc.op},
				{"flat", fmt.Sprintf(flat, tc.letter), FormatDebeziumFlat, tc.flatOp},
			}
			for _, s := range shapes {
				w := want{format: s.format, skip: tc.skip}
				if tc.skip == "" {
					w.events = []wantEvent{{op: s.op, table: "shop.users"}}
				}
				t.Run(s.name, func(t *testing.T) {
					checkDecode(t, &Decoder{Format: s.format}, s.msg, rules.Position{}, w)
				})
			}
		})
	}
	for _, s := range []struct {
		format Format
		msg    string
	}{
		{FormatDebezium, fmt.Sprintf(envelope, "x", "null", row)},
		{FormatDebeziumFlat, fmt.Sprintf(flat, "x")},
	} {
		checkDecode(t, &Decoder{Format: s.format}, s.msg, rules.Position{}, want{errHas: []string{`"x"`, "c, u, d, r, t, m"}})
	}
}

func TestParseFormat(t *testing.T) {
	for _, f := range []Format{FormatAuto, FormatDebezium, FormatDebeziumFlat, FormatMaxwell, FormatCanal, FormatAvro} {
		got, err := ParseFormat(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %v, %v; want %v", f.String(), got, err, f)
		}
	}
	if _, err := ParseFormat("Debezium"); err == nil {
		t.Error("ParseFormat accepted \"Debezium\"")
	}
	if s := Format(99).String(); s != "Format(99)" {
		t.Errorf("Format(99).String() = %q", s)
	}
	if got, want := Names(), []string{"auto", "debezium", "debezium-flat", "maxwell", "canal", "avro"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
	if got, want := Alternatives(FileNames()), "auto, debezium, debezium-flat, maxwell or canal"; got != want {
		t.Errorf("Alternatives(FileNames()) = %q, want %q", got, want)
	}
	if _, err := ParseFileFormat("avro"); !errors.Is(err, ErrNotInFile) {
		t.Errorf("ParseFileFormat(avro) = %v, want ErrNotInFile", err)
	}
	if f, err := ParseFileFormat("maxwell"); err != nil || f != FormatMaxwell {
		t.Errorf("ParseFileFormat(maxwell) = %v, %v", f, err)
	}
}
