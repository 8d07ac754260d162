package decode

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// TestDecodeKeep: with Keep, every fixture decodes to the same events as
// without it, each row image holding exactly the kept columns of the full
// one, in order; messages that fail without Keep fail with it.
func TestDecodeKeep(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "decode", "*.ndjson"))
	if len(files) == 0 {
		t.Fatal("no fixtures")
	}
	keep := []string{"id", "status", "customer_id", "name", "price", "email"}
	full := Decoder{}
	cut := Decoder{Keep: NewColumnSet(keep)}
	rows := 0
	for _, file := range files {
		for n, line := range fixtureLines(t, filepath.Base(file)) {
			var a, b Decoded
			errA := full.Decode([]byte(line), rules.Position{Topic: "t"}, &a)
			errB := cut.Decode([]byte(line), rules.Position{Topic: "t"}, &b)
			where := fmt.Sprintf("%s:%d", filepath.Base(file), n+1)
			if (errA == nil) != (errB == nil) || a.Skip != b.Skip || a.Format != b.Format || len(a.Events) != len(b.Events) {
				t.Fatalf("%s: without Keep %v %q %d events, with Keep %v %q %d events", where, errA, a.Skip, len(a.Events), errB, b.Skip, len(b.Events))
			}
			for i := range a.Events {
				ea, eb := a.Events[i], b.Events[i]
				if ea.Database != eb.Database || ea.Table != eb.Table || ea.Operation != eb.Operation || ea.Source != eb.Source {
					t.Fatalf("%s event %d: %+v vs %+v", where, i, ea, eb)
				}
				for _, pair := range [][2]rules.Row{{ea.Before, eb.Before}, {ea.After, eb.After}} {
					if (pair[0] == nil) != (pair[1] == nil) {
						t.Fatalf("%s event %d: image presence differs", where, i)
					}
					want := pair[0]
					if a.Format != FormatDebeziumFlat {
						want = slices.DeleteFunc(slices.Clone(pair[0]), func(c rules.Column) bool { return !slices.Contains(keep, c.Name) })
					}
					if !slices.Equal(want, pair[1]) {
						t.Fatalf("%s event %d: row %v, want %v", where, i, pair[1], want)
					}
					rows += len(pair[1])
				}
			}
		}
	}
	if rows == 0 {
		t.Fatal("no kept column in any fixture")
	}
}

// TestDecodeKeepValidates: a column that is not kept is still validated.
func TestDecodeKeepValidates(t *testing.T) {
	d := Decoder{Keep: NewColumnSet([]string{"id"})}
	for _, bad := range []string{
		`{"op":"c","after":{"id":1,"note":"a` + "\x01" + `b"},"source":{"db":"d","table":"t"}}`,
		`{"op":"c","after":{"id":1,"note":"\q"},"source":{"db":"d","table":"t"}}`,
		`{"op":"c","after":{"id":1,"n":01},"source":{"db":"d","table":"t"}}`,
		`{"op":"c","after":{"id":1,"o":{"x":tru}},"source":{"db":"d","table":"t"}}`,
	} {
		var out Decoded
		err := d.Decode([]byte(bad), rules.Position{}, &out)
		if err == nil || !strings.Contains(err.Error(), ": after") {
			t.Errorf("%s: err %v, want a decode error in after", bad, err)
		}
	}
}

func TestColumnSet(t *testing.T) {
	long := strings.Repeat("c", 80)
	s := NewColumnSet([]string{"id", "user_id", "id", long, ""})
	for name, want := range map[string]bool{"id": true, "user_id": true, long: true, "": true, "post_id": false, "i": false, long + "x": false} {
		if s.Has(name) != want {
			t.Errorf("Has(%q) = %v", name, !want)
		}
	}
}

// TestDigitsEnd compares the word-at-a-time scan with a byte loop on
// every byte value before, inside and after runs of digits.
func TestDigitsEnd(t *testing.T) {
	slow := func(s string, j int) int {
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		return j
	}
	for n := range 20 {
		for b := range 256 {
			for _, s := range []string{
				strings.Repeat("7", n) + string(rune(0)) + string([]byte{byte(b)}) + "123456789",
				strings.Repeat("0", n) + string([]byte{byte(b)}) + "99999999",
				string([]byte{byte(b)}) + strings.Repeat("9", n),
			} {
				for j := range min(len(s), 3) {
					if got, want := digitsEnd(s, j), slow(s, j); got != want {
						t.Fatalf("digitsEnd(%q, %d) = %d, want %d", s, j, got, want)
					}
				}
			}
		}
	}
}
