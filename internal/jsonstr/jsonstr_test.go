package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppend(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `""`},
		{"plain:key", `"plain:key"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"\x00\x1f\n\r\t", `"\u0000\u001f\n\r\t"`},
		{"\x7f", "\"\x7f\""},
		{"grüße 日本", `"grüße 日本"`},
		{"line\u2028sep\u2029", `"line\u2028sep\u2029"`},
		// A long key cut at 200 bytes in the middle of "é" (0xc3 0xa9).
		{"k:abc\xc3#0123", `"k:abc\ufffd#0123"`},
		{"\xff\xfe", `"\ufffd\ufffd"`},
		{"\xed\xa0\x80", `"\ufffd\ufffd\ufffd"`}, // a UTF-16 surrogate is not UTF-8
	}
	for _, tt := range tests {
		if got := string(Append(nil, tt.in)); got != tt.want {
			t.Errorf("Append(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// FuzzAppend checks that every string becomes valid JSON that
// decodes to the input, with each invalid UTF-8 byte read as U+FFFD.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "a", `"\`, "\x00\x7f", "é\xc3", "\u2028", "\xed\xa0\x80", "%25 x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Append(nil, s)
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("invalid JSON for %q: %s", s, out)
		}
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			want.WriteRune(r) // RuneError for an invalid byte, size 1
			i += size
		}
		if back != want.String() {
			t.Fatalf("%q round-trips to %q, want %q", s, back, want.String())
		}
	})
}
