package itemformat

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseCount: whatever a counter item holds, ParseCount accepts it
// only as docs/formats.md says (ASCII digits, then spaces) and returns
// the number those digits spell.
func FuzzParseCount(f *testing.F) {
	for _, s := range []string{"0", "5 ", "007", "+5", "-0", " 5", "5\t", "9223372036854775808", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		n, ok := ParseCount(value)
		digits := strings.TrimRight(string(value), " ")
		wellFormed := digits != "" && strings.Trim(digits, "0123456789") == ""
		if ok && !wellFormed {
			t.Fatalf("ParseCount(%q) = %d, accepted", value, n)
		}
		if !ok {
			if wellFormed {
				if _, err := strconv.ParseUint(digits, 10, 63); err == nil {
					t.Fatalf("ParseCount(%q) refused a count", value)
				}
			}
			return
		}
		if want := strings.TrimLeft(digits, "0"); strconv.FormatInt(n, 10) != want && !(n == 0 && want == "") {
			t.Fatalf("ParseCount(%q) = %d", value, n)
		}
	})
}
